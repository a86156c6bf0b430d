"""A runtime's load step that runs programs: the `derive` programs, which compute weights from
`source` buffers, each source on the device only from its first reader to its last (SPEC §5)."""

from __future__ import annotations

__all__ = ["run_derives"]


def run_derives(rt, bound: dict) -> dict:
    """Run the derive programs of runtime `rt` (`runtime.runtime.Runtime`, loading) in order, each
    source staged from its first reader to its last.

    Returns the load's accounting: `derived_bytes` (the weights derive programs write),
    `source_peak_bytes` (the widest set of sources live at once), `peak_bytes` (their sum)."""
    m, be, env = rt.manifest, rt.backend, rt.manifest.var_max()
    derives = [p for p in m.programs.values() if p.derive]
    readers: dict[str, list[int]] = {}
    derived: set[str] = set()
    for i, prog in enumerate(derives):
        for call in prog.calls:
            for a, prm in zip(call.args, m.ops[call.op].params):
                if a.kind != "buf":
                    continue
                if prm.reads and m.buffers[a.value].kind == "source":
                    readers.setdefault(a.value, []).append(i)
                if prm.writes and m.buffers[a.value].kind == "weight":
                    derived.add(a.value)
    live: dict[str, int] = {}
    widest = 0
    for i, prog in enumerate(derives):
        for name, at in readers.items():
            if at[0] == i:
                b = m.buffers[name]
                rt.buffers[name] = be.view(be.zeros(b.nbytes(env)), b.dtype)
                be.upload(be.view(rt.buffers[name], "u8"), bound[name])
                live[name] = b.nbytes(env)
        widest = max(widest, sum(live.values()))
        for call in prog.calls:
            rt.run_call(call, env)
        for name, at in readers.items():
            if at[-1] == i:
                be.synchronize()  # its last reader has run: free it
                be.forget(rt.buffers[name])
                del rt.buffers[name], live[name]
    be.synchronize()
    done = sum(m.buffers[n].nbytes(env) for n in derived)
    return {"derived_bytes": done, "source_peak_bytes": widest, "peak_bytes": done + widest}
