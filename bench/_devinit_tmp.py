import os, sys, time, resource
import numpy as np
if not hasattr(np, "row_stack"): np.row_stack = np.vstack
import cupy as cp
from runtime.gpu import numba_cuda
import runtime.gpu
cuda = numba_cuda()
import importlib
for m in ("toy.kernels.gpu",):
    try: importlib.import_module(m)
    except Exception as e: print("imp", m, e)
def go(tag):
    out = []
    def t(name, fn):
        r0 = resource.getrusage(resource.RUSAGE_SELF); w0 = time.monotonic(); fn()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        out.append(f"{name}={time.monotonic()-w0:.2f}/{r1.ru_utime-r0.ru_utime:.2f}u/{r1.ru_stime-r0.ru_stime:.2f}s")
    st = {}
    t("getcount", lambda: cp.cuda.runtime.getDeviceCount())
    t("use", lambda: cp.cuda.Device(0).use())
    t("stream", lambda: st.setdefault("s", cp.cuda.Stream(non_blocking=True)))
    t("nbstream", lambda: st.setdefault("n", cuda.external_stream(st["s"].ptr)))
    t("zeros", lambda: cp.zeros(1 << 20, cp.uint8))
    t("zeros2", lambda: cp.zeros(1 << 30, cp.uint8))
    t("pinned", lambda: cp.cuda.alloc_pinned_memory(1 << 20))
    t("sync", lambda: cp.cuda.runtime.deviceSynchronize())
    print(tag, " ".join(out), flush=True)
n = int(sys.argv[1])
pids = []
for i in range(n):
    pid = os.fork()
    if pid == 0:
        go(f"{n}:{i}"); os._exit(0)
    pids.append(pid)
for p in pids: os.waitpid(p, 0)
