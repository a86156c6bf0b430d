"""The `kern` command: gen, run, test, cut (and serve, registered by the server package)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from kern.tokens import BYTES
from manifests import ManifestError, load
from manifests.config import ConfigError, resolve
from runtime.backend import KernelError
from runtime.chain import StagesError, load_stages
from oracle.version import option as version_option
from runtime.protocol import ProtocolError
from runtime.sequence import RequestError, generate, single
from runtime.weights import WeightsError

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


def _target(ctx, what: str, weights: tuple[str, ...]):
    t = resolve(what, ctx.obj["config"], list(weights) or None)
    return t, load(t.manifest)


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
def run(ctx, target, stages_dir, prompt, prompt_ids, steps, rows, chunk, backend, capacity, weights, device, as_json,
        probe_dir, probe_steps, probe_labels, prompts_file) -> None:
    """Generate greedily for one sequence through the runtime, no server (TARGET, or --stages DIR)."""
    if target is None and stages_dir is None:
        fail("give a TARGET (a target name or a manifest path), or --stages DIR")
    if prompts_file is not None:
        if stages_dir is not None or probe_dir is not None or prompt is not None or prompt_ids is not None:
            fail("--prompts-file runs a TARGET's prompts: not with --stages, --probe-dir, --prompt or --prompt-ids")
        _run_file(ctx, target, prompts_file, steps, rows, chunk, backend, capacity, weights, as_json)
        return
    if prompt is not None and prompt_ids is not None:
        fail("give --prompt or --prompt-ids, not both")
    if steps < 1:
        fail(f"--steps must be >= 1, got {steps}")
    ids = parse_ids(prompt_ids) if prompt_ids is not None else list((prompt if prompt is not None else "The capital of France is").encode())
    try:
        from runtime.protocol import Protocol

        on_step = None
        if stages_dir is not None:
            if probe_dir is not None:
                fail("--probe-dir runs on a whole manifest, not --stages")
            stages = load_stages(stages_dir)
            name, m = stages[-1].model, None
            ws = list(weights) or (list(resolve(target, ctx.obj["config"]).weights) if target else sorted(str(p) for p in Path(stages_dir).glob("*.safetensors")))
            rows = rows or Protocol(stages[-1]).widest
            rt, cell = single(None, ws, len(ids), steps, rows, backend, capacity, stages=stages)
        else:
            t, m = _target(ctx, target, weights)
            name, stages = t.name, None
            rows = rows or Protocol(m).widest
            if probe_dir is not None and "logits" not in m.buffers:
                fail(f"--probe-dir: {t.name} has no logits buffer to dump")
            if probe_dir is not None and probe_steps is not None:
                steps = min(steps, probe_steps)
            rt, cell = single(m, list(t.weights), len(ids), steps, rows, backend, capacity)
            if probe_dir is not None:
                from oracle.probe import write as write_probe

                def on_step(tag: str, tokens: list[int]) -> None:
                    write_probe(Path(probe_dir), tag, rt.logits(1)[0], tokens)

        g = generate(rt, cell, ids, steps, rows, chunk, on_step=on_step)
    except USER_ERRORS as exc:
        fail(str(exc))
    text = bytes(g.ids).decode("utf-8", "replace")
    if as_json:
        extra = {"stages": len(stages)} if stages else {}
        click.echo(json.dumps({"target": name, **extra, "prompt_ids": ids, "ids": g.ids, "text": text, "rows": rows,
                               "rounds": g.rounds, "drafted": g.drafted, "accepted": g.accepted, "load": rt.load_report}))
        return
    click.echo(bytes(t for t in ids if t < BYTES).decode("utf-8", "replace") + text)
    click.echo(f"generated ids: {g.ids}", err=True)


def _run_file(ctx, target, path, steps, rows, chunk, backend, capacity, weights, as_json) -> None:
    """`kern run --prompts-file`: each line's ids through its own sequence, answers in order."""
    if steps < 1:
        fail(f"--steps must be >= 1, got {steps}")
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
    try:
        from runtime.protocol import Protocol

        t, m = _target(ctx, target, weights)
        rows = rows or Protocol(m).widest
    except USER_ERRORS as exc:
        fail(str(exc))
    for n, ids in prompts:
        try:
            rt, cell = single(m, list(t.weights), len(ids), steps, rows, backend, capacity)
            g = generate(rt, cell, ids, steps, rows, chunk)
        except USER_ERRORS as exc:  # a token outside the vocabulary, a prompt over the capacity: its line
            fail(f"{path}:{n}: {exc}")
        if as_json:
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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: the verdict, the exit code and each case.")
@click.pass_context
def test_cmd(ctx, target, cand, ref, steps, backend, weights, device, as_json) -> None:
    """A/B the candidate build against its -ref twin: ids and final state bytes. Exit 0 PASS, 1 FAIL, 2 INCONCLUSIVE."""
    from oracle.abtest import ab_test

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
    said: list[str] = []
    code = ab_test(a, b, ws, steps, backend, echo=said.append if as_json else click.echo)
    if as_json:
        click.echo(json.dumps(_test_json(said, code)))
    sys.exit(code)


def _test_json(said: list[str], code: int) -> dict:
    """`kern test --json`: ab_test's lines as one object. Each case line is `  ok|FAIL|skip  LABEL: DETAIL`;
    the last line is the verdict (PASS, FAIL or INCONCLUSIVE, then its reason)."""
    cases = []
    for line in said[:-1]:
        status, _, rest = line.strip().partition(" ")
        label, _, detail = rest.strip().partition(": ")
        cases.append({"status": {"ok": "pass", "FAIL": "fail", "skip": "skip"}.get(status, status), "case": label,
                      "detail": detail})
    verdict, _, why = said[-1].partition(": ") if said else ("INCONCLUSIVE", "", "nothing ran")
    return {"verdict": verdict, "exit": code, "summary": why, "cases": cases}


@main.command("verify")
@click.argument("manifest")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.pass_context
def verify_cmd(ctx, manifest, as_json) -> None:
    """Load and verify MANIFEST (a path, or a target's name) without a device, and print what it derives:
    its states, the page and reach, every program with its calls' shapes. Exit 0 verified, 1 when the
    manifest has problems (each named), 2 a usage error."""
    from manifests.describe import describe, lines

    path = Path(manifest)
    if not path.exists():
        try:
            path = Path(resolve(manifest, ctx.obj["config"], None).manifest)
        except USER_ERRORS as exc:
            fail(f"{manifest} is neither a manifest file nor a target: {exc}")
    try:
        d = describe(load(path))
    except ManifestError as exc:
        click.echo(str(exc), err=True)
        sys.exit(1)
    click.echo(json.dumps(d) if as_json else "\n".join(lines(d)))


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
        t, m = _target(ctx, manifest, weights)
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
