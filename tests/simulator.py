"""Run a test module's `_simulate()` in a subprocess under numba's CUDA simulator.

The simulator is chosen when numba.cuda is first imported, hence the subprocess. Its block manager
polls its threads in a busy loop, so under CPython's default 5 ms switch interval each simulated
`syncthreads` waits out whole intervals; at 0.1 ms the same run takes a fifth of the time (17 s ->
3.6 s for tests/test_gpu_sim.py on a 2-core box). The interval changes only how often threads
switch, never what they compute.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SWITCH_INTERVAL_S = 1e-4


def simulate(module: str, timeout: float = 300) -> None:
    """Run `module._simulate()` simulated; assert it exited 0 and printed "simulated: all equal"."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONWARNINGS="ignore")
    code = f"import sys; sys.setswitchinterval({SWITCH_INTERVAL_S}); from {module} import _simulate; _simulate()"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "simulated: all equal" in r.stdout, r.stdout[-3000:]
