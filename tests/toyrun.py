"""Helpers for tests that drive the toy targets through the runtime."""

from functools import lru_cache
from pathlib import Path

import manifests
from manifests.config import PACKAGED, load_config

CONFIG = load_config(PACKAGED)
SHAPES = tuple(CONFIG.targets)
SPEC_SHAPES = ("toy-spec", "toy-stateful-spec")


@lru_cache(maxsize=None)
def target(name: str):
    t = CONFIG.targets[name]
    return manifests.load(t.manifest), [str(w) for w in t.weights]


def manifest_path(name: str) -> Path:
    return CONFIG.targets[name].manifest
