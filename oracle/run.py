"""`kern run`'s work: one sequence generated greedily through the runtime, no server (a target's
manifest, a cut's stages in one process, or each prompt of a file). `kern/cli.py` parses the flags
into `RunOptions` and prints what comes back; what is refused here is a `RunError` (exit 2 there)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from kern.errors import KernError
from manifests import ManifestError, load
from manifests.config import ConfigError, resolve
from runtime.backend import KernelError
from runtime.chain import StagesError, load_stages
from runtime.protocol import ProtocolError
from runtime.sequence import Generation, RequestError, generate, single
from runtime.weights import WeightsError

__all__ = ["USER_ERRORS", "RunError", "RunOptions", "Ran", "target", "run", "read_prompts", "run_file"]

USER_ERRORS = (ManifestError, ConfigError, RequestError, ProtocolError, WeightsError, KernelError, StagesError)
"""What a user's input can make loading or running refuse: said in one line, never a traceback."""


class RunError(KernError, ValueError):
    """Flags of `kern run` that do not go together, or a prompt it cannot run (its message names which)."""


@dataclass
class RunOptions:
    """`kern run`'s flags, built at once by the command (one field a flag, under its parameter name)."""

    config: str | None
    target: str | None
    stages_dir: str | None
    prompt: str | None
    prompt_ids: str | None
    steps: int
    rows: int | None
    chunk: int | None
    backend: str
    capacity: int | None
    weights: tuple[str, ...]
    device: str | None
    as_json: bool
    probe_dir: str | None
    probe_steps: int | None
    probe_labels: str
    prompts_file: str | None

    def check(self) -> None:
        """Refuse flags that do not go together, in the order `kern run` has always named them."""
        if self.target is None and self.stages_dir is None:
            raise RunError("give a TARGET (a target name or a manifest path), or --stages DIR")
        if self.prompts_file is not None:
            if self.stages_dir is not None or self.probe_dir is not None or self.prompt is not None \
                    or self.prompt_ids is not None:
                raise RunError("--prompts-file runs a TARGET's prompts: not with --stages, --probe-dir, --prompt or --prompt-ids")
        elif self.prompt is not None and self.prompt_ids is not None:
            raise RunError("give --prompt or --prompt-ids, not both")
        if self.steps < 1:
            raise RunError(f"--steps must be >= 1, got {self.steps}")


@dataclass
class Ran:
    """What one `kern run` sequence gave: the model's name, the stages (0: a whole manifest), the rows
    per step it ran at, the generation and the load report."""

    name: str
    stages: int
    rows: int
    generation: Generation
    load: dict


def target(config: str | None, what: str, weights: tuple[str, ...] | list[str]):
    """A target (a name in the config, or a manifest path) and its loaded manifest."""
    t = resolve(what, config, list(weights) or None)
    return t, load(t.manifest)


def run(o: RunOptions, ids: list[int]) -> Ran:
    """One sequence: `ids` then up to `o.steps` tokens, through TARGET's manifest or --stages DIR's cut."""
    return _run_stages(o, ids) if o.stages_dir is not None else _run_target(o, ids)


def _run_stages(o: RunOptions, ids: list[int]) -> Ran:
    """`kern run --stages DIR`: the cut's stages in order in one process."""
    from runtime.protocol import Protocol

    if o.probe_dir is not None:
        raise RunError("--probe-dir runs on a whole manifest, not --stages")
    stages = load_stages(o.stages_dir)
    ws = list(o.weights) or (list(resolve(o.target, o.config).weights) if o.target
                             else sorted(str(p) for p in Path(o.stages_dir).glob("*.safetensors")))
    rows = o.rows or Protocol(stages[-1]).widest
    rt, cell = single(None, ws, len(ids), o.steps, rows, o.backend, o.capacity, stages=stages)
    return Ran(stages[-1].model, len(stages), rows, generate(rt, cell, ids, o.steps, rows, o.chunk), rt.load_report)


def _run_target(o: RunOptions, ids: list[int]) -> Ran:
    """`kern run TARGET`: one manifest, its logits dumped each step with --probe-dir."""
    from runtime.protocol import Protocol

    t, m = target(o.config, o.target, o.weights)
    rows = o.rows or Protocol(m).widest
    if o.probe_dir is not None and "logits" not in m.buffers:
        raise RunError(f"--probe-dir: {t.name} has no logits buffer to dump")
    steps = min(o.steps, o.probe_steps) if o.probe_dir is not None and o.probe_steps is not None else o.steps
    rt, cell = single(m, list(t.weights), len(ids), steps, rows, o.backend, o.capacity)
    on_step = None
    if o.probe_dir is not None:
        from oracle.probe import write as write_probe

        def on_step(tag: str, tokens: list[int]) -> None:
            write_probe(Path(o.probe_dir), tag, rt.logits(1)[0], tokens)

    return Ran(t.name, 0, rows, generate(rt, cell, ids, steps, rows, o.chunk, on_step=on_step), rt.load_report)


def read_prompts(path: str) -> list[tuple[int, list[int]]]:
    """--prompts-file's lines: (line number, token ids) for each line that is not blank."""
    prompts = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            ids = json.loads(line)
        except ValueError as exc:
            raise RunError(f"{path}:{n}: not JSON ({exc})") from None
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise RunError(f"{path}:{n}: want a non-empty JSON list of token ids, got {line[:80]!r}")
        prompts.append((n, ids))
    return prompts


def run_file(o: RunOptions) -> Iterator[tuple[str, list[int], Generation, int]]:
    """`kern run --prompts-file`: each line's ids through its own sequence, in the file's order: (the
    target's name, the prompt's ids, its generation, the rows per step) for each, as each ends. A
    line the runtime refuses (a token outside the vocabulary, a prompt over the capacity) is a
    `RunError` naming the file and the line, after the lines before it were given."""
    prompts = read_prompts(o.prompts_file)
    from runtime.protocol import Protocol

    t, m = target(o.config, o.target, o.weights)
    rows = o.rows or Protocol(m).widest
    for n, ids in prompts:
        try:
            rt, cell = single(m, list(t.weights), len(ids), o.steps, rows, o.backend, o.capacity)
            g = generate(rt, cell, ids, o.steps, rows, o.chunk)
        except USER_ERRORS as exc:
            raise RunError(f"{o.prompts_file}:{n}: {exc}") from None
        yield t.name, ids, g, rows
