"""The `kern` command: its flags parsed here, each verb's work done by the package that owns it.

    gen      toy.gen            the toy manifests, their salt, weights and configs
    run      oracle.run         one sequence through the runtime, no server
    test     oracle.abtest      a build against its reference twin (exit 0 PASS, 1 FAIL, 2 INCONCLUSIVE)
    verify   oracle.verify      a manifest loaded and verified without a device, its geometry printed
    cut      manifests.cut      a manifest split into pipeline stages
    serve    serve.cli          the server (also `server`)
    replay   replay.cli         a trace replayed against the serving core's admission

and, hidden from `--help`, the gate's warm parents of `kern` commands: `kern zygote` (oracle.zygote)
and `kern host` (oracle.host), each given `run_command` to run what it is sent.

This module may import every package; no package imports it (tests/test_imports.py): what a verb
does lives in its package, so that package runs without this face. Importing it loads no kernel
(numba, cupy): a zygote or host chooses numba's threading layer after it, before numba is imported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from kern.tokens import BYTES
from oracle.run import USER_ERRORS, RunError, RunOptions
from oracle.version import option as version_option

__all__ = ["main", "run_command", "parse_ids", "fail"]


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
    try:
        o.check()
        if o.prompts_file is not None:
            return _run_file(o)
        ids = parse_ids(o.prompt_ids) if o.prompt_ids is not None else list(
            (o.prompt if o.prompt is not None else "The capital of France is").encode())
        _print_run(o, ids)
    except (*USER_ERRORS, RunError) as exc:
        fail(str(exc))


def _print_run(o: RunOptions, ids: list[int]) -> None:
    """One `kern run` sequence, printed: its text (stdout) and ids (stderr), or one JSON object."""
    from oracle.run import run as run_sequence

    r = run_sequence(o, ids)
    g = r.generation
    text = bytes(g.ids).decode("utf-8", "replace")
    if o.as_json:
        extra = {"stages": r.stages} if r.stages else {}
        click.echo(json.dumps({"target": r.name, **extra, "prompt_ids": ids, "ids": g.ids, "text": text, "rows": r.rows,
                               "rounds": g.rounds, "drafted": g.drafted, "accepted": g.accepted, "load": r.load}))
        return
    click.echo(bytes(t for t in ids if t < BYTES).decode("utf-8", "replace") + text)
    click.echo(f"generated ids: {g.ids}", err=True)


def _run_file(o: RunOptions) -> None:
    """`kern run --prompts-file`: a line for each prompt, in the file's order, as each ends."""
    from oracle.run import run_file

    for name, ids, g, rows in run_file(o):
        if o.as_json:
            click.echo(json.dumps({"target": name, "prompt_ids": ids, "ids": g.ids, "rows": rows}))
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
    from oracle.abtest import PairError, pair, run_cases

    try:
        a, b, ws = pair(ctx.obj["config"], target, cand, ref, weights)
    except (*USER_ERRORS, PairError) as exc:
        fail(str(exc))
    out = run_cases(a, b, ws, steps, backend, echo=(lambda line: None) if as_json else click.echo)
    if as_json:
        click.echo(json.dumps(out.as_json(b.model)))
    sys.exit(out.code)


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
    from manifests import ManifestError
    from manifests.config import ConfigError
    from manifests.cut import CutError, cut, report, write
    from oracle.run import target as load_target

    try:
        points = parse_ids(at)
    except click.BadParameter as exc:
        fail(f"--at: {exc.message}")
    try:
        t, m = load_target(ctx.obj["config"], manifest, weights)
        stages = cut(m, points)
    except CutError as exc:
        fail(f"cannot cut {manifest} at {at}: {exc}")
    except (ManifestError, ConfigError) as exc:
        fail(str(exc))
    dest = write(stages, out, t.weights)
    click.echo(report(stages))
    click.echo(f"{len(stages)} stages -> {dest}")


HOSTED = dict(context_settings={"ignore_unknown_options": True, "help_option_names": []}, hidden=True)
"""The hidden verbs' settings: every argument (`--help` too) is the hosting module's own to parse."""


@main.command("zygote", **HOSTED)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def zygote_cmd(args: tuple[str, ...]) -> None:
    """The gate's warm parent, forking a `kern` process for each command it is sent (oracle/zygote.py)."""
    from oracle import zygote

    zygote.main(list(args), run_command)


@main.command("host", **HOSTED)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def host_cmd(args: tuple[str, ...]) -> None:
    """The gate's warm process running `kern` commands as threads on one device (oracle/host.py)."""
    from oracle import host

    host.main(list(args), run_command)


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
