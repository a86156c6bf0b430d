"""`--version` for `kern`, `kern serve` (`kern-serve`) and `e2e`: the package's version, and the git
commit when the code runs from a checkout (a clone or a worktree), e.g.

    kern 0.1.0 (commit 1a2b3c4d5e6f, modified, /work/kern)

The commit is read only when `--version` is asked for (one `git` call or two), never at import, so
starting a command costs nothing extra. `GET /version` on `kern serve` answers the package version
alone, as vLLM's does (serve/api/app.py `VERSION`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import click

__all__ = ["checkout", "option", "package_version", "describe"]

ROOT = Path(__file__).resolve().parents[1]  # the directory holding the packages


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's), or "unknown" when kern is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kern")
    except PackageNotFoundError:
        return "unknown"


def checkout(root: Path = ROOT) -> tuple[str, bool] | None:
    """(short commit, whether tracked files differ from it) when `root` is a git checkout's top, else
    None (an installed wheel, or git missing)."""
    if not (root / ".git").exists():  # a clone has a directory here, a worktree a file
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0 or not head.stdout.strip():
            return None
        dirty = subprocess.run(["git", "-C", str(root), "diff-index", "--quiet", "HEAD", "--"], capture_output=True,
                               timeout=10).returncode == 1
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip(), dirty


def describe(prog: str, root: Path = ROOT) -> str:
    """The `--version` line."""
    line = f"{prog} {package_version()}"
    got = checkout(root)
    if got is not None:
        commit, dirty = got
        line += f" (commit {commit}{', modified' if dirty else ''}, {root})"
    return line


def option(prog: str):
    """click's eager `--version` flag: print `describe(prog)` and exit 0 (before any argument is
    checked, as `--help`)."""

    def show(ctx: click.Context, _param, value: bool) -> None:
        if not value or ctx.resilient_parsing:
            return
        click.echo(describe(prog))
        ctx.exit(0)

    return click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=show,
                        help="Show the version (and the git commit, from a checkout) and exit.")
