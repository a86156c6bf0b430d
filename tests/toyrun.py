"""Helpers for tests that drive the toy targets through the runtime."""

import json
from functools import lru_cache
from pathlib import Path

import manifests
from manifests.config import PACKAGED, load_config

CONFIG = load_config(PACKAGED)
# the float toy's answers may part from the reference's at near-ties: tests/test_toy_float.py
FLOAT_SHAPES = tuple(n for n, t in CONFIG.targets.items() if "logits" in json.loads(t.manifest.read_text())["buffers"])
SHAPES = tuple(n for n in CONFIG.targets if n not in FLOAT_SHAPES)  # the exact toys
SPEC_SHAPES = ("toy-spec", "toy-stateful-spec")


@lru_cache(maxsize=None)
def target(name: str):
    t = CONFIG.targets[name]
    return manifests.load(t.manifest), [str(w) for w in t.weights]


def manifest_path(name: str) -> Path:
    return CONFIG.targets[name].manifest
