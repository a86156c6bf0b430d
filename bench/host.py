"""Park and wake through the runtime beside a plain pinned copy of the same bytes, in the same run.

    python bench/host.py                     # GPU: toy-big, 4 GiB of snapshots (SPEC §11)
    python bench/host.py --gib 1 --backend cpu

Snapshots are runs of consecutive toy-big pages (4 MiB each), of mixed lengths, scattered over the
device arena and laid end to end in the host tier; each is parked (device to host) and later woken
(host to device, into other pages) with one `Runtime.park` / `Runtime.wake` call, as the server
does, and the runtime coalesces each snapshot's pages into one copy. The wall time runs from the
first call to the last copy landed. The ceiling is one plain copy of all the bytes between the same
arena and the same pinned memory, each direction. A second figure parks single pages (no runs).
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import numpy as np

import manifests
from manifests.config import PACKAGED, load_config
from runtime.runtime import Runtime

from kernels import best_of  # bench/kernels.py, beside this script




def snapshots(pages: int, rng, lo: int, hi: int) -> list[tuple[int, int]]:
    """(first page, length) runs covering device pages 1..pages in a shuffled order."""
    runs, p = [], 1
    while p <= pages:
        n = min(int(rng.integers(lo, hi + 1)), pages - p + 1)
        runs.append((p, n))
        p += n
    order = rng.permutation(len(runs))
    return [runs[i] for i in order]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="toy-big")
    ap.add_argument("--gib", type=float, default=4.0, help="bytes moved each way, GiB (default 4)")
    ap.add_argument("--backend", default="gpu", choices=["cpu", "gpu"])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    t = load_config(PACKAGED).targets[args.target]
    m = manifests.load(t.manifest)
    hp = manifests.page_unit(m) * sum(s.bytes_per_token for s in m.states.values() if s.paged)
    n = max(int(args.gib * 2**30) // hp, 2)
    # device: page 0 unused, 1..n the parked set, n+1..2n the woken copies
    rt = Runtime(m, [str(w) for w in t.weights], pages=2 * n + 1, backend=args.backend, host_bytes=n * hp)
    be = rt.backend
    name = next(iter(rt.arenas))
    arena = rt.arenas[name]
    pb = rt.page_bytes[name]
    rng = np.random.default_rng(5)
    xp = np
    if args.backend == "gpu":
        import cupy as xp
    with getattr(be, "stream", None) or _nothing():
        words = be.view(arena[pb : (n + 1) * pb], "u64")
        words[:] = xp.arange(words.size, dtype=xp.uint64) * xp.uint64(0x9E3779B97F4A7C15)
    be.synchronize()

    runs = snapshots(n, rng, 1, 64)
    park_plans, wake_plans, single = _plans(runs, n, hp, rng)

    def go(plans, fn):
        def run():
            for c in plans:
                fn(c)
            be.synchronize()
        return run

    total = n * pb
    park = best_of(args.repeat, go(park_plans, rt.park))
    wake = best_of(args.repeat, go(wake_plans, rt.wake))
    park1 = best_of(args.repeat, go(single, rt.park))

    # the woken pages hold what was parked
    for first, k in runs[:8]:
        a = be.download(arena[first * pb : (first + k) * pb], k * pb)
        b = be.download(arena[(n + first) * pb : (n + first + k) * pb], k * pb)
        assert np.array_equal(a, b), f"snapshot at page {first} did not round-trip"

    plain = _plain(args.backend, xp, rt.host, arena[pb : (n + 1) * pb], total)
    plain_d2h = best_of(args.repeat, lambda: plain(True))
    plain_h2d = best_of(args.repeat, lambda: plain(False))

    print(f"target {args.target}, backend {args.backend}: {n} pages of {pb / 2**20:.0f} MiB = {total / 2**30:.2f} GiB each way, "
          f"{len(runs)} snapshots of 1-64 pages")
    _table(total, park, park1, wake, plain_d2h, plain_h2d)


def _table(total: int, park: float, park1: float, wake: float, plain_d2h: float, plain_h2d: float) -> None:
    """GB/s of each copy (best seconds given), and its ratio to the plain pinned copy's."""
    g = lambda dt: total / dt / 1e9  # noqa: E731
    print(f"{'figure':<44}{'GB/s':>10}{'ratio':>8}")
    print(f"{'park (device->host), snapshots':<44}{g(park):>10.1f}{plain_d2h / park:>8.2f}")
    print(f"{'park, single pages (no runs)':<44}{g(park1):>10.1f}{plain_d2h / park1:>8.2f}")
    print(f"{'ceiling: plain pinned copy device->host':<44}{g(plain_d2h):>10.1f}")
    print(f"{'wake (host->device), snapshots':<44}{g(wake):>10.1f}{plain_h2d / wake:>8.2f}")
    print(f"{'ceiling: plain pinned copy host->device':<44}{g(plain_h2d):>10.1f}")


def _plans(runs, n: int, hp: int, rng) -> tuple[list, list, list]:
    """(park plans, wake plans: one per snapshot run, its pages to consecutive host offsets and back to
    the woken copies; single-page park plans in a random order)."""
    host_off, off = {}, 0
    for first, k in runs:
        host_off[first] = off
        off += k * hp
    park_plans = [SimpleNamespace(pages=[(first + i, host_off[first] + i * hp) for i in range(k)], slot=None) for first, k in runs]
    wake_plans = [SimpleNamespace(pages=[(host_off[first] + i * hp, n + first + i) for i in range(k)], slot=None) for first, k in runs]
    single = [SimpleNamespace(pages=[(p, (p - 1) * hp)], slot=None) for p in rng.permutation(np.arange(1, n + 1)).tolist()]
    return park_plans, wake_plans, single


def _plain(backend: str, xp, host, dev, total: int):
    """The ceiling: one plain copy of all `total` bytes, `plain(to_host)` (on a GPU one cudaMemcpyAsync
    on a fresh stream)."""
    if backend == "gpu":
        stream = xp.cuda.Stream(non_blocking=True)

        def plain(to_host):
            d, s = (host.ctypes.data, dev.data.ptr) if to_host else (dev.data.ptr, host.ctypes.data)
            xp.cuda.runtime.memcpyAsync(d, s, total, 4, stream.ptr)
            stream.synchronize()
    else:
        def plain(to_host):
            if to_host:
                np.copyto(host[:total], dev)
            else:
                np.copyto(dev, host[:total])
    return plain


if __name__ == "__main__":
    main()
