#!/bin/bash
# Serve the kern toy with SGLang 0.5.23 on the CPU on 127.0.0.1:PORT: torch_native attention, its radix
# prefix cache on, pages of 32 tokens, a KV pool of CACHE_TOKENS (the gate's {cache_tokens}; 1,536 by
# default). The model is kern_sgl_toy (SGLANG_EXTERNAL_MODEL_PACKAGE); sgl_shim stands in for
# sgl-kernel, which has no CPU build on PyPI (README.md).
# usage: examples/sglang_toy/serve.sh [PORT [CACHE_TOKENS]] [extra SGLang args]   (VENV: setup.sh's venv)
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${VENV:-/work/sglang-venv}
PORT=${1:-30000}; shift
if [[ ${1:-} =~ ^[0-9]+$ ]]; then CACHE=$1; shift; else CACHE=1536; fi
export SGLANG_USE_CPU_ENGINE=1 SGLANG_EXTERNAL_MODEL_PACKAGE=kern_sgl_toy
export PYTHONPATH=$HERE/sgl_shim:$HERE:$HERE/../vllm_toy  # toy_reference: the constants
exec "$VENV/bin/python" -m sglang.launch_server --model-path "$HERE/model" \
  --served-model-name kern-toy-vllm --device cpu --host 127.0.0.1 --port "$PORT" \
  --load-format dummy --dtype float32 --context-length 1024 \
  --attention-backend torch_native --sampling-backend pytorch --grammar-backend none \
  --disable-overlap-schedule --page-size 32 --max-total-tokens "$CACHE" --chunked-prefill-size 64 \
  --enable-cache-report --mem-fraction-static 0.05 --max-running-requests 32 "$@"
