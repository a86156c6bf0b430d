"""The gate driver: every target of a config through the server as a client, token-exact (SPEC §10).

- `config`: the targets (`GateTarget`) and why one is skipped.
- `log`: the server's key=value log lines.
- `session`: a server subprocess (start, ready, teardown, exits mid-scenario).
- `client`: completions over HTTP, request ids mirrored.
- `checks`: the check list of one target, with progress and `--scenarios` selection.
- `scenarios`: the steps, their sessions and what each gates.
- `gate`: one target through every session; `report`: report.json, summary.md, JUnit.
- `cli`: the `e2e` command.
"""
