"""The manifest format: schema (frozen dataclasses), load + verify, derived geometry.

    ManifestError        a manifest that fails to parse or verify; `.problems` lists every one
"""

from manifests.schema import (
    Buffer,
    Call,
    Launch,
    Manifest,
    ManifestError,
    Module,
    Op,
    Program,
    State,
    Var,
)
from manifests.load import load, parse
from manifests.derive import page_unit, reach, is_lined

__all__ = [
    "Buffer",
    "Call",
    "Launch",
    "Manifest",
    "ManifestError",
    "Module",
    "Op",
    "Program",
    "State",
    "Var",
    "is_lined",
    "load",
    "page_unit",
    "parse",
    "reach",
]
