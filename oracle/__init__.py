"""Answers without the server: `kern run`, `kern test`, the reference loader, the answer cache."""
