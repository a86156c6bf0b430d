#!/bin/bash
# Make the venv serve.sh runs (VENV, default /work/sglang-venv): SGLang 0.5.23 on the CPU beside torch 2.13.0+cpu. ~4 min with pip's cache warm.
# sglang 0.5.23's wheel pins torch==2.14.1 and CUDA-only packages (flashinfer, sglang-kernel, cuda-python, ...),
# so it goes in with --no-deps, and the dependencies the CPU server path imports go in beside it, torch pinned.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
V=${VENV:-/work/sglang-venv}
python3 -m venv "$V"
$V/bin/pip install torch==2.13.0                                    # the local CPU wheel
C=$(mktemp); echo "torch==2.13.0" > "$C"
$V/bin/pip install --no-deps sglang==0.5.23
$V/bin/pip install -c "$C" aiohttp fastapi "uvicorn>=0.51" uvloop orjson pyzmq pydantic \
  transformers==5.19.0 tokenizers==0.23.2 psutil setproctitle msgspec pybase64 requests "prometheus-client>=0.20.0" \
  numpy tqdm partial_json_parser openai==2.8.0 openai-harmony==0.0.4 einops python-multipart sentencepiece==0.2.1 \
  tiktoken xxhash blobfile==3.0.0 pillow scipy watchfiles interegular packaging python-dateutil distro easydict regex \
  zstandard "llguidance>=1.7.6,<2" xgrammar==0.2.7 IPython anthropic gguf ninja build \
  dill compressed_tensors jsonschema soundfile
# torchvision: sglang imports torchvision.transforms at start-up (sglang/srt/multimodal/internvl_utils.py). The
# only torchvision 0.28.0 at hand is the CUDA build, whose ops do not register beside torch 2.13.0+cpu
# ("RuntimeError: operator torchvision::nms does not exist"); patch its __init__ to skip those registrations.
$V/bin/pip install --no-deps torchvision==0.28.0
f=$($V/bin/python -c "import importlib.util as u; print(u.find_spec('torchvision').submodule_search_locations[0])")/__init__.py
$V/bin/python - "$f" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
old = "from torchvision import (\n    _autograd_registrations,\n    _meta_registrations,\n"
new = ("# kern patch: the CUDA torchvision's C ops do not load beside torch 2.13.0+cpu\n"
       "try:\n    from torchvision import _autograd_registrations, _meta_registrations\nexcept RuntimeError:\n    pass\n"
       "from torchvision import (\n")
if old in s:
    open(p, "w").write(s.replace(old, new))
PY
# sgl-kernel: PyPI's (0.3.21) is CUDA-only ("ImportError: libnvrtc.so.12"), its CPU build needs the SGLang git tree
# (sgl-kernel/pyproject_cpu.toml), which is not reachable here: sgl-shim/sgl_kernel stands in (README.md).
$V/bin/python -m pip uninstall -y sgl-kernel 2>/dev/null || true
echo "done: $V"
