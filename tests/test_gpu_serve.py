"""The server on the GPU backend: answers, hits and the host tier as on the CPU (skipped without a GPU).

The whole server suite also runs on a GPU with `KERN_TEST_BACKEND=gpu python -m pytest tests/test_serve_*.py`.
"""

import concurrent.futures

import pytest

from conftest import PROMPTS, ask, assert_nothing_leaked, oracle

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


def _gpu() -> bool:
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


if not _gpu():
    pytest.skip("no CUDA GPU", allow_module_level=True)


@pytest.mark.parametrize("target", ["toy-paged", "toy-stateful", "toy-spec", "toy-stateful-spec", "toy-big"])
def test_twelve_at_once_on_the_gpu_equal_the_model(kern_server, target):
    s = kern_server(target, "--capacity", "16384", backend="gpu")
    assert s.stats()["facts"]["backend"] == "gpu"
    ids = [list(p.encode()) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(12) as ex:
        got = list(ex.map(lambda i: ask(s, i, 48), ids))
    for i, r in zip(ids, got):
        assert r["ids"] == oracle(target, i, 48)
    assert_nothing_leaked(s)


@pytest.mark.parametrize("wait", ["yield", "blocking"])
def test_each_gpu_wait_answers_as_the_model(kern_server, wait):
    """`--gpu-wait yield|blocking` (the engine core's threads waiting on the GPU other than by CUDA's
    own spin) changes how the host waits, never what it reads back: answers equal the model's."""
    s = kern_server("toy-paged", "--capacity", "16384", "--gpu-wait", wait, backend="gpu")
    ids = [list(p.encode()) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(12) as ex:
        got = list(ex.map(lambda i: ask(s, i, 48), ids))
    for i, r in zip(ids, got):
        assert r["ids"] == oracle("toy-paged", i, 48)
    assert_nothing_leaked(s)
