"""cut_equals_whole: the target cut at every legal point, and at a seeded handful of points at once.

No server: for a single-process target whose manifest can be cut (`oracle.cutrun.cut_points`: on the
toys, `toy-layers`, at each of its five layer boundaries), each single cut and one multi-point cut
drawn from `--seed` are made (a manifest whose state is all declared per layer, `kv.0`, `kv.1`, ...,
must cut at every call boundary: a refused one fails the check) (`manifests/cut.py`, as `kern cut` makes them), their stages chained in
one process (as `kern run --stages` runs them), and two prompts' answers gated identical to the
reference, and (where the answer is the whole manifest's) every state byte of the sequence identical
to the whole manifest's run in process. The shipped pipelines (`toy-layers-pp2`, `-pp3`) cut at the balanced points only: this
reaches the others, and a cut that moves a buffer or a state region wrongly changes an answer.
"""

from __future__ import annotations

import random

from e2e.prompts import PROMPTS
from oracle.cutrun import boundaries, cut_points, run_with_state
from verdicts import Same

PROMPTS_PER_CUT = 2
TOKENS = 32  # answer tokens per run: every token goes through every stage; the runs are the gate process's own


def applies(t) -> bool:
    """A single-process target whose manifest is ours and can be cut (an --engine's target may name a
    manifest of its own format: then there is nothing of ours to cut)."""
    from manifests.schema import ManifestError

    if t.stages > 1 or t.skipped:
        return False
    try:
        return bool(cut_points(str(t.manifest)))
    except ManifestError:
        return False


def run(r) -> None:
    t = r.target
    points = cut_points(str(t.manifest))
    rng = random.Random(f"{getattr(r.opts, 'seed', 0)}:{t.model}:cuts")
    cuts = [[k] for k in points]
    if len(points) > 1:
        cuts.append(sorted(rng.sample(points, rng.randint(2, len(points)))))
    calls, per_layer = boundaries(str(t.manifest))
    refused = [k for k in range(1, calls) if k not in points] if per_layer else []
    picks = [(at, i) for at in cuts for i in rng.sample(range(len(PROMPTS)), PROMPTS_PER_CUT)]
    m = min(r.m, TOKENS)
    firsts = list(dict.fromkeys(i for _, i in picks))
    jobs = [(at, list(PROMPTS[i].encode())) for at, i in picks] + [([], list(PROMPTS[i].encode())) for i in firsts]
    results = _runs(t.manifest, list(t.weights), jobs, m, r.rows)
    whole = dict(zip(firsts, results[len(picks):]))  # prompt -> the whole manifest's answer and state
    same = Same(r.oracle, r.rows)
    states = 0
    differ: list[str] = []
    for (at, i), (got, state) in zip(picks, results):
        ids = list(PROMPTS[i].encode())
        label = f"cut at {','.join(map(str, at))}, prompt {i + 1}"
        same.add(label, ids, got, r.oracle.run(ids, m, r.rows))
        if got == whole[i][0]:  # the same answer: every state byte the same too
            states += 1
            if state != whole[i][1]:
                k = next((j for j, (x, y) in enumerate(zip(state, whole[i][1])) if x != y),
                         min(len(state), len(whole[i][1])))
                differ.append(f"{label}: state differs from the whole manifest's from byte {k} of {len(state)}")
    note = (f"{len(cuts)} cuts ({'; '.join(','.join(map(str, c)) for c in cuts)}; seed {getattr(r.opts, 'seed', 0)}), "
            f"{same}; state identical to the whole manifest's in {states - len(differ)}/{states}")
    if differ:
        note += "; " + "; ".join(differ[:3])
    if refused:  # its state is all per layer: every call boundary must cut (docs/cut.md)
        note += f"; refused at {refused} of boundaries 1..{calls - 1}, though its state is all per layer"
    r.checks.add("cut_equals_whole", same.ok and not refused and not differ, note, same.excused)


def _runs(manifest, weights: list, jobs: list, m: int, rows: int) -> list[tuple[list[int], bytes]]:
    """Every run (cut points, prompt ids) in a process of its own, answers and state bytes in order: the
    runtime's CPU kernels hold the interpreter lock for a whole call, and every lane's clients share the
    gate's (on an H200 these runs held it for seconds of the gate's critical path)."""
    import concurrent.futures
    import multiprocessing

    args = [(str(manifest), [str(w) for w in weights], list(at), ids, m, rows) for at, ids in jobs]
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=_one_thread) as ex:
        return list(ex.map(_one, args))


def _one_thread() -> None:
    """The worker's kernels on one thread: these runs are a few short prompts, and numba's default (a
    thread per core) spun every core of a 16-core machine against the gate's servers for nothing."""
    import numba

    numba.set_num_threads(1)


def _one(args) -> tuple[list[int], bytes]:
    return run_with_state(*args)
