"""Which stage manifests `kern serve` runs: a cut directory as given, or TARGET cut into `--stages`
stages at `--at`, the config's `cut = [...]`, or the layer boundaries that balance calls per stage.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from kern.errors import KernError

__all__ = ["PlanError", "balanced", "pipeline_paths", "parse_at"]


class PlanError(KernError, ValueError):
    """A pipeline that cannot be made as asked (bad --at, more stages than boundaries, ...)."""


def parse_at(at: str | None) -> list[int] | None:
    if at is None:
        return None
    try:
        points = [int(x) for x in at.replace(" ", "").split(",") if x]
    except ValueError:
        raise PlanError(f"--at {at!r}: expected call indices separated by commas (e.g. 6,12)") from None
    if not points:
        raise PlanError(f"--at {at!r}: no cut points")
    return points


def balanced(calls: int, candidates: list[int], stages: int, held: dict[int, int] | None = None,
             total: int | None = None) -> list[int]:
    """stages-1 increasing cut points out of `candidates` (the call indices a cut may fall on),
    each the nearest to an even share of `calls` that keeps them increasing.

    With `held` (candidate -> how many of the manifest's `total` states the calls before it hold), every
    stage must hold at least one state: the points' `held` counts strictly increase, the first is over
    0 and the last under `total` (a stage without a state has no pages to share the head's)."""
    if len(candidates) < stages - 1:
        raise PlanError(f"{stages} stages need {stages - 1} cut points; the manifest has {len(candidates)} "
                        f"place(s) to cut ({', '.join(map(str, candidates)) or 'none'})")
    if held is not None:
        levels = {held[c] for c in candidates if 0 < held[c] < total}
        if len(levels) < stages - 1:
            raise PlanError(f"{stages} stages cannot each hold a state: the manifest's {total} state(s) split into at "
                            f"most {len(levels) + 1} stage(s) that do (a stage holding no state has no pages); "
                            f"use --stages 1..{len(levels) + 1}")
    out: list[int] = []
    for i in range(1, stages):
        ideal = i * calls / stages
        lo = out[-1] if out else 0
        left = stages - 1 - i  # points still to place after this one
        usable = [c for c in candidates if c > lo]
        if held is not None:
            floor = held[lo] if out else 0
            usable = [c for c in usable if floor < held[c] < total
                      and len({held[b] for b in candidates if b > c and held[c] < held[b] < total}) >= left]
        else:
            usable = usable[: len(usable) - left] if left else usable
        out.append(min(usable, key=lambda c: (abs(c - ideal), c)))
    return out


def stateless(stages) -> list[int]:
    """The indices of the cut's stages that hold no state."""
    return [st.index for st in stages if not st.raw.get("states")]


def _driven_calls(m) -> int:
    return min(len(p.calls) for p in m.programs.values() if p.batched)


def _cut(m, at: list[int]):
    """manifests.cut's stages, its refusal as a PlanError."""
    from manifests.cut import CutError, cut

    try:
        return cut(m, at)
    except CutError as exc:
        raise PlanError(f"cannot cut {m.model} at {','.join(map(str, at))}: {exc}") from exc


def _cuts(m, at: list[int]) -> bool:
    try:
        _cut(m, at)
    except PlanError:
        return False
    return True


def write_stages(m, at: list[int], out: Path) -> list[Path]:
    """Cut `m` at `at` and write each stage's manifest into `out`, in stage order."""
    paths = []
    for st in _cut(m, at):
        p = out / f"{m.model}.stage{st.index}.json"
        p.write_text(_text(st))
        paths.append(p)
    return paths


def _text(st) -> str:
    return json.dumps(st.raw, indent=1) + "\n"


def shared_stages(m, at: list[int], root: Path | None = None) -> list[Path]:
    """The cut's stage manifests in a directory named for their content (``kern-cut-<model>-<hash>``
    under the temporary directory), written once and shared by every server that runs the same cut.
    Nothing is left per server run, however it ends (a SIGKILLed server runs no cleanup): the
    directory is made whole under a private name and renamed into place, so a reader never sees half
    of it and two servers starting at once both end up with the one copy."""
    stages = _cut(m, at)
    digest = hashlib.sha256("".join(_text(st) for st in stages).encode()).hexdigest()[:16]
    root = Path(root) if root is not None else Path(tempfile.gettempdir())
    final = root / f"kern-cut-{m.model}-{digest}"
    names = [final / f"{m.model}.stage{st.index}.json" for st in stages]
    if not all(p.is_file() for p in names):
        work = Path(tempfile.mkdtemp(prefix=f".kern-cut-{digest}-", dir=root))
        write_stages(m, at, work)
        try:
            os.rename(work, final)
        except OSError:  # another server put it there first (or a partial one is in the way)
            shutil.rmtree(work, ignore_errors=True)
            if not all(p.is_file() for p in names):
                raise PlanError(f"{final} exists without the cut's stage manifests in it: remove it and start again")
    return names


def pipeline_paths(what: str, stages: int | None, at: str | None, config, weights, listen: bool):
    """(stage manifest paths, weights) to serve as a pipeline, or None for a single process."""
    from manifests.config import resolve

    p = Path(what)
    if p.is_dir():

        if stages not in (None, 1) or at is not None:
            raise PlanError(f"{what} is a cut directory: it already says its stages (drop --stages/--at)")
        return stage_paths(what), None
    target = resolve(what, config, weights)
    n = stages if stages is not None else target.stages
    if n < 1:
        raise PlanError(f"--stages {n} must be >= 1")
    if n == 1:
        if listen:
            raise PlanError("--pp-listen needs --stages N (N >= 2) or a cut directory")
        if at is not None:
            raise PlanError("--at needs --stages N (N >= 2)")
        return None
    from manifests import load

    m = load(target.manifest)
    points = parse_at(at) or (list(target.cut) if target.cut and stages in (None, target.stages) else None)
    if points is None:
        calls = _driven_calls(m)
        cands = [a for a in range(1, calls) if _cuts(m, [a])]
        held = {a: len(_cut(m, [a])[0].raw.get("states") or {}) for a in cands}
        points = balanced(calls, cands, n, held, len(m.raw.get("states") or {}))
    if len(points) != n - 1:
        raise PlanError(f"{n} stages need {n - 1} cut point(s); got {len(points)}: {points}")
    empty = stateless(_cut(m, points))
    if empty:
        raise PlanError(f"cutting {m.model} at {','.join(map(str, points))} leaves stage(s) "
                        f"{','.join(map(str, empty))} holding no state (a stage needs pages to share the head's); "
                        "cut elsewhere (--at)")
    return shared_stages(m, points), target.weights


def stage_paths(what: str) -> list[Path]:
    """A cut directory's stage manifests, in stage order (every `*.json` carrying a `cut`)."""
    from manifests import load
    from serve.pipeline.stage import cut_of

    d = Path(what)
    found = []
    for p in sorted(d.glob("*.json")):
        try:
            raw = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(raw, dict) or "cut" not in raw:
            continue
        m = load(p)
        cid, k, n = cut_of(m)
        if n > 1:
            found.append((k, n, cid, p))
    if not found:
        raise PlanError(f"{what}: no stage manifests (JSON with a `cut`) in this directory")
    ids = {cid for _, _, cid, _ in found}
    n = found[0][1]
    ks = sorted(k for k, _, _, _ in found)
    if len(ids) != 1 or ks != list(range(n)):
        raise PlanError(f"{what}: the stage manifests are not one whole cut (stages {ks} of {n}, ids {sorted(ids)})")
    return [p for _, _, _, p in sorted(found)]
