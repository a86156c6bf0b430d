"""The `kern` command: gen, run, test, verify, cut (and serve and replay, registered by their packages)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kern.tokens import BYTES
from manifests import ManifestError, load
from manifests.config import ConfigError, resolve
from runtime.backend import KernelError
from runtime.chain import StagesError, load_stages
from oracle.version import option as version_option
from runtime.protocol import ProtocolError
from runtime.sequence import Generation, RequestError, generate, single
from runtime.weights import WeightsError

if TYPE_CHECKING:
    from oracle.abtest import Outcome

USER_ERRORS = (ManifestError, ConfigError, RequestError, ProtocolError, WeightsError, KernelError, StagesError)


def fail(msg: str, code: int = 2) -> None:
    click.echo(f"kern: error: {msg}", err=True)
    sys.exit(code)


def run_command(argv: list[str]) -> int:
    """Run `kern ARGV` here and return the exit code a process running it would have had (for a
    command run in a forked child or a host's thread, whose `sys.exit` must not end the caller)."""
    try:
        main(argv, prog_name="kern")
        return 0
    except SystemExit as exc:
        c = exc.code
        if not isinstance(c, int) and c is not None:
            print(c, file=sys.stderr)
        return c if isinstance(c, int) else (0 if c is None else 1)


def parse_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {text!r}") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("kern")
@click.option("--config", type=click.Path(dir_okay=False), default=None, help="TOML with [targets.NAME] tables (default: nearest kern.toml, else the packaged toy config).")
@click.pass_context
def main(ctx: click.Context, config: str | None) -> None:
    """kern: a manifest-driven runtime for paged-KV models, its toy model, and its oracles."""
    ctx.obj = {"config": config}


@main.command()
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Directory to write toy/*.json, toy/salt.safetensors, toy.toml and toy-pp.toml into.")
def gen(out: str) -> None:
    """Write the toy manifests (each with its -ref twin), their salt, the layered toy's checkpoint and their configs (toy.toml; toy-pp.toml: toy-layers through pipeline stages)."""
    from toy.gen import generate as gen_toy

    paths = gen_toy(out)
    click.echo(f"{sum(p.suffix == '.json' for p in paths)} manifests, salt and config -> {out}")


def _target(config: str | None, what: str, weights: tuple[str, ...]):
    t = resolve(what, config, list(weights) or None)
    return t, load(t.manifest)


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
            fail("give a TARGET (a target name or a manifest path), or --stages DIR")
        if self.prompts_file is not None:
            if self.stages_dir is not None or self.probe_dir is not None or self.prompt is not None \
                    or self.prompt_ids is not None:
                fail("--prompts-file runs a TARGET's prompts: not with --stages, --probe-dir, --prompt or --prompt-ids")
        elif self.prompt is not None and self.prompt_ids is not None:
            fail("give --prompt or --prompt-ids, not both")
        if self.steps < 1:
            fail(f"--steps must be >= 1, got {self.steps}")


@dataclass
class _Ran:
    """What one `kern run` sequence gave: the model's name, the stages (0: a whole manifest), the rows
    per step it ran at, the generation and the load report."""

    name: str
    stages: int
    rows: int
    generation: Generation
    load: dict


@main.command()
@click.argument("target", required=False)
@click.option("--stages", "stages_dir", default=None, type=click.Path(), help="Run the stages of a cut (the *.json `kern cut` wrote in this directory) in order in one process, each crossing buffer copied into the next stage. Weights: --weights, else TARGET's, else every *.safetensors in the directory.")
@click.option("--prompt", default=None, help="Prompt text (its UTF-8 bytes are the ids). Default: 'The capital of France is'.")
@click.option("--prompt-ids", default=None, help="Prompt as comma-separated token ids (0..256).")
@click.option("--steps", default=32, show_default=True, type=int, help="Most tokens to generate.")
@click.option("--rows", default=None, type=int, help="Rows per step: 1 = plain decode, else a speculative round (default: the widest declared).")
@click.option("--chunk", default=None, type=int, help="Prefill chunk in tokens (default: the manifest's tokens bound; may only be lowered).")
@click.option("--backend", default="cpu", type=click.Choice(["auto", "cpu", "gpu"]), show_default=True)
@click.option("--capacity", default=None, type=int, help="Tokens the state may hold (default: exactly this sequence's room plus the pad).")
@click.option("--weights", multiple=True, help="Weights file(s) (default: the target's, or every *.safetensors beside a manifest path).")
@click.option("--gpu", "--device", "device", default=None, help="GPU index (accepted for the Rust kern's sake).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text (with `load`: the bytes load held at its peak, derived weights plus the widest set of live sources).")
@click.option("--probe-dir", type=click.Path(file_okay=False), default=None,
              help="Write each step's logits here in the Rust kern's probe layout: <tag>.logits.bin (bf16 rows) "
                   "and <tag>.tokens.bin (i64), tags chunk (an emitting prefill), decode0, decode1, ...")
@click.option("--probe-steps", type=click.IntRange(min=1), default=None,
              help="With --probe-dir: stop after this many decode steps (default: every step of the run).")
@click.option("--probe-labels", default="", help="Accepted for the Rust kern's sake: only logits and tokens are dumped.")
@click.option("--prompts-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Run each prompt of this file (one JSON list of token ids a line), each its own sequence "
                   "through one process's runtime; with --json, one object a line, in the file's order.")
@click.pass_context
def run(ctx, **flags) -> None:
    """Generate greedily for one sequence through the runtime, no server (TARGET, or --stages DIR)."""
    o = RunOptions(config=ctx.obj["config"], **flags)
    o.check()
    if o.prompts_file is not None:
        _run_file(o)
        return
    ids = parse_ids(o.prompt_ids) if o.prompt_ids is not None else list(
        (o.prompt if o.prompt is not None else "The capital of France is").encode())
    try:
        r = _run_stages(o, ids) if o.stages_dir is not None else _run_target(o, ids)
    except USER_ERRORS as exc:
        fail(str(exc))
    g = r.generation
    text = bytes(g.ids).decode("utf-8", "replace")
    if o.as_json:
        extra = {"stages": r.stages} if r.stages else {}
        click.echo(json.dumps({"target": r.name, **extra, "prompt_ids": ids, "ids": g.ids, "text": text, "rows": r.rows,
                               "rounds": g.rounds, "drafted": g.drafted, "accepted": g.accepted, "load": r.load}))
        return
    click.echo(bytes(t for t in ids if t < BYTES).decode("utf-8", "replace") + text)
    click.echo(f"generated ids: {g.ids}", err=True)


def _run_stages(o: RunOptions, ids: list[int]) -> _Ran:
    """`kern run --stages DIR`: the cut's stages in order in one process."""
    from runtime.protocol import Protocol

    if o.probe_dir is not None:
        fail("--probe-dir runs on a whole manifest, not --stages")
    stages = load_stages(o.stages_dir)
    ws = list(o.weights) or (list(resolve(o.target, o.config).weights) if o.target
                             else sorted(str(p) for p in Path(o.stages_dir).glob("*.safetensors")))
    rows = o.rows or Protocol(stages[-1]).widest
    rt, cell = single(None, ws, len(ids), o.steps, rows, o.backend, o.capacity, stages=stages)
    return _Ran(stages[-1].model, len(stages), rows, generate(rt, cell, ids, o.steps, rows, o.chunk), rt.load_report)


def _run_target(o: RunOptions, ids: list[int]) -> _Ran:
    """`kern run TARGET`: one manifest, its logits dumped each step with --probe-dir."""
    from runtime.protocol import Protocol

    t, m = _target(o.config, o.target, o.weights)
    rows = o.rows or Protocol(m).widest
    if o.probe_dir is not None and "logits" not in m.buffers:
        fail(f"--probe-dir: {t.name} has no logits buffer to dump")
    steps = min(o.steps, o.probe_steps) if o.probe_dir is not None and o.probe_steps is not None else o.steps
    rt, cell = single(m, list(t.weights), len(ids), steps, rows, o.backend, o.capacity)
    on_step = None
    if o.probe_dir is not None:
        from oracle.probe import write as write_probe

        def on_step(tag: str, tokens: list[int]) -> None:
            write_probe(Path(o.probe_dir), tag, rt.logits(1)[0], tokens)

    return _Ran(t.name, 0, rows, generate(rt, cell, ids, steps, rows, o.chunk, on_step=on_step), rt.load_report)


def _read_prompts(path: str) -> list[tuple[int, list[int]]]:
    """--prompts-file's lines: (line number, token ids) for each line that is not blank."""
    prompts = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            ids = json.loads(line)
        except ValueError as exc:
            fail(f"{path}:{n}: not JSON ({exc})")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            fail(f"{path}:{n}: want a non-empty JSON list of token ids, got {line[:80]!r}")
        prompts.append((n, ids))
    return prompts


def _run_file(o: RunOptions) -> None:
    """`kern run --prompts-file`: each line's ids through its own sequence, answers in order."""
    prompts = _read_prompts(o.prompts_file)
    try:
        from runtime.protocol import Protocol

        t, m = _target(o.config, o.target, o.weights)
        rows = o.rows or Protocol(m).widest
    except USER_ERRORS as exc:
        fail(str(exc))
    for n, ids in prompts:
        try:
            rt, cell = single(m, list(t.weights), len(ids), o.steps, rows, o.backend, o.capacity)
            g = generate(rt, cell, ids, o.steps, rows, o.chunk)
        except USER_ERRORS as exc:  # a token outside the vocabulary, a prompt over the capacity: its line
            fail(f"{o.prompts_file}:{n}: {exc}")
        if o.as_json:
            click.echo(json.dumps({"target": t.name, "prompt_ids": ids, "ids": g.ids, "rows": rows}))
        else:
            click.echo(f"{ids} -> {g.ids}")


@main.command("test")
@click.argument("target", required=False)
@click.option("--manifest", "cand", default=None, type=click.Path(dir_okay=False), help="Candidate manifest (B), instead of a target.")
@click.option("--reference", "ref", default=None, type=click.Path(dir_okay=False), help="Reference manifest (A), instead of the target's.")
@click.option("--steps", default=32, show_default=True, type=int)
@click.option("--backend", default="cpu", type=click.Choice(["auto", "cpu", "gpu"]), show_default=True)
@click.option("--weights", multiple=True, help="Weights file(s) for both builds.")
@click.option("--gpu", "--device", "device", default=None, help="GPU index (accepted for the Rust kern's sake).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object on stdout instead of the lines: the verdict, the exit code and what each "
                   "code means, the counts (cases, ran, pass, fail, skip, near_ties) and each case.")
@click.pass_context
def test_cmd(ctx, target, cand, ref, steps, backend, weights, device, as_json) -> None:
    """A/B the candidate build against its -ref twin: ids and final state bytes. Exit 0 PASS, 1 FAIL, 2 INCONCLUSIVE."""
    from oracle.abtest import run_cases

    try:
        if target:
            t = resolve(target, ctx.obj["config"], list(weights) or None)
            cand_path, ref_path, ws = Path(cand or t.manifest), ref or t.reference, list(t.weights)
            if ref_path is None:
                fail(f"target {target} has no reference manifest to test against")
        else:
            if not (cand and ref):
                fail("give a TARGET, or both --manifest and --reference")
            cand_path, ref_path = Path(cand), Path(ref)
            ws = list(weights) or sorted(str(p) for p in cand_path.parent.glob("*.safetensors"))
        a, b = load(ref_path), load(cand_path)
    except USER_ERRORS as exc:
        fail(str(exc))
    out = run_cases(a, b, ws, steps, backend, echo=(lambda line: None) if as_json else click.echo)
    if as_json:
        click.echo(json.dumps(_test_json(b.model, out)))
    sys.exit(out.code)


def _test_json(model: str, out: "Outcome") -> dict:
    """`kern test --json`: the verdict and its exit code, what each code means, the counts, each case."""
    from oracle.abtest import VERDICTS

    return {"model": model, "verdict": VERDICTS[out.code], "exit": out.code, "summary": out.summary,
            "exit_codes": {str(c): v for c, v in VERDICTS.items()}, "counts": out.counts(),
            "cases": [{"status": c.status, "case": c.label, "detail": c.detail, "near_ties": c.near_ties}
                      for c in out.cases]}


@main.command("verify")
@click.argument("manifest")
@click.option("--weights", multiple=True,
              help="Weights file(s) to check (default: the target's, or every *.safetensors beside a manifest path).")
@click.option("--no-weights", "skip_weights", is_flag=True,
              help="Check the manifest alone, without reading its weights files (each is read whole and hashed "
                   "otherwise); the Rust kern's verify checks no weights.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.pass_context
def verify_cmd(ctx, manifest, weights, skip_weights, as_json) -> None:
    """Load and verify MANIFEST (a path, or a target's name) without a device, and print what it derives:
    its states, the page and reach, every program with its calls' shapes.

    Checks every field and reference, each kernel module's sha256 against its sources and, unless
    --no-weights, the weights: every pinned file present and hashing to its pin, every bound tensor
    there. Nothing is compiled. Exit 0 verified; 1 a problem, each on one line on stderr
    (`kern verify: PROBLEM`: the file and the field); 2 a usage error."""
    from oracle.verify import Problems, text, verify

    try:
        v = verify(manifest, ctx.obj["config"], list(weights), not skip_weights)
    except Problems as exc:
        for line in exc.lines:
            click.echo(f"kern verify: {line}", err=True)
        sys.exit(1)
    click.echo(json.dumps(v.as_json()) if as_json else "\n".join(text(v)))


@main.command("cut")
@click.argument("manifest")
@click.option("--at", "at", required=True, help="Cut points: comma-separated call indices; stage s runs calls at[s-1]..at[s]-1 of every driven program.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Directory for stage-0.json, stage-1.json, ... (and links to the weights).")
@click.option("--weights", multiple=True, help="Weights file(s) to link beside the stages (default: the target's, or every *.safetensors beside a manifest path).")
@click.pass_context
def cut_cmd(ctx, manifest, at, out, weights) -> None:
    """Split MANIFEST (a path or a target name) into pipeline stages at call indices.

    Buffers live across a cut become outputs of the stage before and inputs (inouts when
    rewritten) of the stage after; each state region belongs to one stage; once and derive
    programs are sliced to what each stage reads. Prints each stage's edges and state use."""
    from manifests.cut import CutError, cut, report

    try:
        points = parse_ids(at)
    except click.BadParameter as exc:
        fail(f"--at: {exc.message}")
    try:
        t, m = _target(ctx.obj["config"], manifest, weights)
        stages = cut(m, points)
    except CutError as exc:
        fail(f"cannot cut {manifest} at {at}: {exc}")
    except (ManifestError, ConfigError) as exc:
        fail(str(exc))
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    for st in stages:
        (dest / f"stage-{st.index}.json").write_text(json.dumps(st.raw, indent=1) + "\n")
    for w in t.weights:
        link = dest / Path(w).name
        if link.resolve() != Path(w).resolve():
            link.unlink(missing_ok=True)
            link.symlink_to(Path(w).resolve())
    click.echo(report(stages))
    click.echo(f"{len(stages)} stages -> {dest}")


def _register_optional() -> None:
    try:
        from serve.cli import serve_command
    except ImportError as exc:  # the server's dependencies are missing: say so, not "No such command"
        why = f"needs the server's dependencies, which do not import here: {exc} (install kern: pip install -e .)"
        for name in ("serve", "server", "replay"):
            main.add_command(_missing(name, why), name)
        return
    main.add_command(serve_command, "serve")
    main.add_command(serve_command, "server")
    from replay.cli import replay_command

    main.add_command(replay_command, "replay")


def _missing(name: str, why: str) -> click.Command:
    @click.command(name, context_settings=dict(ignore_unknown_options=True, allow_extra_args=True),
                   add_help_option=False, help=f"Unavailable here: {why}")
    def cmd() -> None:
        click.echo(f"kern {name}: error: {why}", err=True)
        sys.exit(2)

    return cmd


_register_optional()


if __name__ == "__main__":
    main()
