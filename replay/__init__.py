"""Trace replay (`kern replay`): a request trace run through the serving core's admission and the
real pool and prefix index with no device (`run.py`), against a server (`server.py`), read from
Mooncake-style JSONL (`traces.py`, `mooncake.py`), drawn (`plot.py`); the command is `cli.py`."""
