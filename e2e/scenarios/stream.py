"""stream_equals_whole: prompts 1-4 again, streamed (``"stream": true``, server-sent events), give token
for token the ids, and the finish reason, their whole answers gave (conc1's), and end with ``data: [DONE]``.

Sent as ids, so an engine with `stream` alone (no `text`) is judged. The streamed requests are not the
policy oracle's (it is told whole answers only): its exact predictions end here.
"""

from __future__ import annotations

from typing import Any

from e2e.results import Cold
from verdicts import Same

STREAMED = 4


def streamed(data: dict[str, Any]) -> tuple[list[int], str | None]:
    """A streamed response's generated ids (every chunk's ``token_ids`` in order) and its finish reason."""
    ids: list[int] = []
    finish = None
    for chunk in data.get("chunks") or []:
        choice = (chunk.get("choices") or [{}])[0]
        ids += list(choice.get("token_ids") or [])
        finish = choice.get("finish_reason") or finish
    return ids, finish


def run(r) -> None:
    r.serial_ends("streamed answers (the policy oracle is told whole ones only)")
    client = r.need("default").client
    same = Same(r.oracle, r.rows)
    problems = []
    for i, whole in enumerate(r.got(Cold).answers[:STREAMED]):
        body = {"model": r.target.model, "prompt": whole.prompt_ids, "max_tokens": r.m, "temperature": 0,
                "return_token_ids": True, "stream": True}
        data, name = client.request(body)
        ids, finish = streamed(data)
        if finish == "stop" and ids:
            ids.pop()  # a stopped answer ends with its stop token, as a whole one does (`Client.complete`)
        same.add(f"prompt {i + 1} streamed (request {name})", whole.prompt_ids, ids, whole.ids)
        if finish != whole.finish:
            problems.append(f"prompt {i + 1} streamed: finish_reason {finish!r}, whole {whole.finish!r}")
        if not data.get("done"):
            problems.append(f"prompt {i + 1} streamed: no `data: [DONE]` line at the end")
    r.checks.add("stream_equals_whole", same.ok and not problems, "; ".join([f"{same} (against the whole answers)",
                                                                             *problems]))
