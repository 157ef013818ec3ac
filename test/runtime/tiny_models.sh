# The tiny models the runtime tests and the memory benchmark train (sourced; needs $WORK):
# GPT-2 style with 4 or 8 layers, and a LLaMA style one (RMSNorm, SwiGLU, RoPE, GQA).
GPT=(--layers 4 --hidden 64 --heads 4 --vocab 256 --seq-len 32)
GPT8=(--layers 8 --hidden 64 --heads 4 --vocab 256 --seq-len 32)
cat >"$WORK/llama.json" <<'JSON'
{"name": "tiny-llama", "arch": "decoder", "norm": "rmsnorm", "activation": "swiglu",
 "position": "rope", "tied_embeddings": false, "bias": false, "dropout": false, "layers": 4,
 "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 96, "vocab": 256, "seq_len": 32}
JSON
LLAMA=(--model "$WORK/llama.json")
