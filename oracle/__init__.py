"""Answers without the server: `kern run`'s, `kern test`'s and `kern verify`'s work, the reference loader,
the answer cache, probes, and the warm processes the gate runs `kern` commands in (the command's face,
its flags, is `kern/cli.py`)."""
