"""The README's `e2e --port` arithmetic is the code's: each session's offset is `SESSION_PORTS`'
(its first `Step` row's `port`) and a target's block under `--jobs` is as wide as there are sessions (e2e/driver.py's SESSIONS)."""

import re
from pathlib import Path

from e2e.driver import SESSIONS
from e2e.scenarios import SESSION_PORTS

README = (Path(__file__).parent.parent / "README.md").read_text()


def _ports_paragraph() -> str:
    start = README.index("**Ports.**")
    return " ".join(README[start:README.index("\n\n", start)].split())


def test_each_session_offset_the_readme_names_is_the_codes():
    text = _ports_paragraph()
    named = {m[1]: int(m[2] or 0) for m in re.finditer(r"`(\w+)` P(?:\+(\d+))?\b", text)}
    assert len(named) >= 3 and "default" in named, text
    assert named == {n: SESSION_PORTS[n] for n in named}
    last = max(SESSION_PORTS.values())
    assert f"{len(SESSION_PORTS)} sessions today" in text and f"P..P+{last} " in text, text


def test_the_readme_gives_a_target_block_as_wide_as_the_sessions():
    text = _ports_paragraph()
    n = SESSIONS
    assert n == len(SESSION_PORTS)
    blocks = re.findall(r"P\+(\d+)i\.\.P\+(\d+)i\+(\d+)", text)
    assert blocks == [(str(n), str(n), str(n - 1))], text
