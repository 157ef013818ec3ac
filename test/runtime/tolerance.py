"""Tolerances of the equals-serial tests, derived from the arithmetic (issue 41).

A parallel run and its serial twin do the same fp32 operations, except that sums are grouped
and ordered differently: tensor parallelism splits a GEMM's inner dimension, data and context
parallelism split the loss mean and the gradient sums, micro-batches accumulate gradients in
another order, and BLAS kernels block their sums by the vector width of the CPU they run on.
The tolerances below bound the difference that reordering alone can make, so that they hold
on any CPU and any instruction set, and a real error (a missing reduction, a wrong shard, a
stale buffer) still fails.

Rounding model. u = 2^-24 is fp32's unit roundoff. A sum of n terms computed in any order is
within gamma_n * sum|x_i| of the exact one in the worst case (Higham, "Accuracy and Stability
of Numerical Algorithms", 2nd ed., eq. 4.4); the worst case needs every rounding error to
point the same way. Modelling rounding errors as independent and mean-zero, the error is
within LAMBDA * sqrt(n) * u * sum|x_i| with probability at least 1 - 2 exp(-LAMBDA^2 / 2)
(Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019, Theorem 3.1). LAMBDA = 8 puts a chance
failure below 3e-14 per bound. Errors of the successive reductions of one pass are
independent too, so they add in quadrature: a pass whose reductions have lengths n_k is
within LAMBDA * u * sqrt(sum_k n_k) (relative, each reduction assumed well conditioned, which
the normalisations and the softmax keep them).
"""
import json
import math

U = 2.0 ** -24  # fp32 unit roundoff
LAMBDA = 8.0    # the probabilistic bound's multiplier (failure probability < 3e-14 per bound)


def reduction_lengths(model, plan):
    """The lengths of the sums in one forward pass, in the order they run.

    Per layer: the norm's mean over the hidden size, q.k over the head size, the softmax's sum
    and P.V over the sequence, the output projection over the attention width, the second norm,
    fc1 over the hidden size and fc2 over the FFN width (an MoE layer's experts also sum the
    top-k outputs). Then the final norm, the logits over the hidden size, the log-sum-exp over
    the vocabulary and the loss mean over every token of the step."""
    hidden, seq = model["hidden"], model["seq_len"]
    heads = model["heads"]
    head = model.get("head_dim") or hidden // heads
    ffn = model["ffn_hidden"]
    moe = model.get("moe") or {}
    if moe.get("experts"):
        ffn = max(ffn, moe.get("expert_ffn_hidden") or ffn)
    per_layer = [hidden, head, seq, seq, heads * head, hidden, hidden, ffn]
    if moe.get("experts"):
        per_layer += [moe["experts"], moe["top_k"]]  # the router's softmax, the combine
    tokens = plan["global_batch"] * seq
    return per_layer * model["layers"] + [hidden, hidden, model["vocab"], tokens]


def pass_rtol(model, plan):
    """Relative difference of one forward (or backward) pass's result between two orders."""
    return LAMBDA * U * math.sqrt(sum(reduction_lengths(model, plan)))


def loss_rtol(model, plan, steps):
    """Relative tolerance of the loss logged at each of `steps` steps.

    The loss of step t carries its own forward pass's rounding and, through the weights, that
    of the t-1 updates before it. An AdamW update moves each weight by at most lr per step
    whatever its gradient, and changes the loss to first order by the inner product of the
    gradient with the update's difference; an element whose update flips because its gradient
    is lost in rounding has |g| below that rounding, so the update's share of the loss
    difference is at most one pass's relative error again. The worst step, the last, is then
    within `steps` passes' errors, which are independent: sqrt(steps) in quadrature, bounded
    here by `steps` to keep the argument first order."""
    return steps * pass_rtol(model, plan)


def grad_rtol(model, plan):
    """Relative rounding of a gradient element: the backward pass's chain of reductions (the
    forward's lengths again) and the sum over the step's tokens that makes a weight's gradient
    (already counted as the loss mean's length)."""
    return math.sqrt(2.0) * pass_rtol(model, plan)


# The worst conditioning allowed of a gradient element's sum, sum|terms| / |sum|: its rounding
# is grad_rtol times this. Gradients over a step's tokens mostly add terms of mixed sign; 10^3
# bounds every element measured here (the worst, an expert's fc2 gradient of -2e-9 among
# entries of 1e-4, moves its weight by 2.8e-3 of the learning rates' sum, a tenth of what this
# allows), and a real error (a missing reduction, a wrong shard) moves whole rows by a large
# part of the learning rate, far beyond it.
K_CONDITION = 1e3


def weight_atol(model, plan, lrs):
    """Absolute tolerance of each final weight.

    AdamW moves a weight by lr_t * m_hat / (sqrt(v_hat) + eps) at step t. A relative change r
    of the gradient changes that update by about r of its size (m_hat and v_hat move
    together), and never by more than 2 (its direction reversed), whatever the gradient: the
    normalisation turns a relative gradient error into the same relative step error, which is
    why a near-zero gradient's last bits move a weight at all. So two runs' weights differ by at
    most sum_t lr_t * min(2, K_CONDITION * grad_rtol) after the steps. (Decoupled weight decay
    multiplies both by 1 - lr * wd: it shrinks a difference, never grows it.)"""
    return float(sum(lrs)) * min(2.0, K_CONDITION * grad_rtol(model, plan))


def run_facts(checkpoint, log):
    """The model, plan and optimizer settings from a checkpoint, and the learning rate of each
    step from the run's --log-json."""
    import h5py
    with h5py.File(checkpoint, "r") as f:
        model = json.loads(f.attrs["model"])
        plan = json.loads(f.attrs["plan"])
        extra = json.loads(f.attrs["extra"])
    lrs = [json.loads(line)["lr"] for line in open(log)]
    return model, plan, extra["optimizer"], lrs
