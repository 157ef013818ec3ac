// llm.c (karpathy/llm.c, train_gpt2.cu), the H100 calibration row r143.
{
  "name": "llm.c",
  "description": "llm.c train_gpt2.cu: bf16 cuBLASLt kernels, ZeRO-1, hand-written fused kernels.",
  "gradients": {
    // train_gpt2.cu matmul_backward: the weight gradient is computed by cuBLASLt with
    //   accumulate = true (beta = 1) straight into the bf16 grads buffer.
    "wgrad_accumulation_fused": true,
    "accumulation_bytes": 2
  }
}
