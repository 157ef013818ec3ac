// Multi-head Latent Attention's work (DeepSeek-V2/V3): the shapes behind workload.hpp's rules
// when ModelSpec::attention is mla. workload.cpp calls these for the attention block; the
// Program, the cost model and the search reach them only through workload.hpp.
#pragma once
#include <cstdint>

#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"
#include "stratagem/workload.hpp"

namespace stratagem::mla {

// Weights of the block's GEMMs (no norms): q_a_proj and q_b_proj (or q_proj), kv_a_proj_with_mqa,
// kv_b_proj and o_proj.
int64_t gemm_weights(const ModelSpec& m);
// Forward FLOPs per token of the attention core over all s positions (the count workload.cpp
// uses for multi-head attention, 4 s h): QK^T at the query/key head width
// qk_nope_head_dim + qk_rope_head_dim and AV at v_head_dim, 2 s heads (d_qk + d_v).
double core_flops_per_token(const ModelSpec& m);

// Refuses what the MLA rules do not describe yet: tensor parallelism (Megatron-Core replicates
// the down-projections and splits the up-projections by head; not modelled).
void check_supported(const ModelSpec& m, const LayerStrategy& s);

BlockWork core_work(const ModelSpec& m, const LayerStrategy& s, int samples, bool flash);
BlockWork forward_work(const ModelSpec& m, const LayerStrategy& s, int samples, bool flash);
int64_t saved_activation_bytes(const ModelSpec& m, const LayerStrategy& s, int samples,
                               Recompute rc, bool flash, Dtype dt);
// The backward's scratch of the block (the gradients of its projections' outputs).
int64_t workspace_bytes(const ModelSpec& m, const LayerStrategy& s, int samples, Dtype dt);
int64_t block_parameters_per_rank(const ModelSpec& m, int tp);

}  // namespace stratagem::mla
