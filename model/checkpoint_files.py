"""Reading a checkpoint's small files: JSON in one-line errors, transformers' legacy weight names, and whether a
tokenizer lowercases. A leaf: it imports nothing of model/, so every module reading a checkpoint imports it at
the top (no import inside a function to break a circle)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnserve.errors import CheckpointError

# Old TensorFlow-era LayerNorm names, which transformers renames on load (its "legacy" key renaming).
LEGACY_NORM_NAMES = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}


def read_json(path: Path) -> Any:
    """A JSON file's value; a missing or unreadable file is a one-line CheckpointError naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file missing: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint file unreadable: {path}: {e}") from None


def read_object(path: Path) -> dict:
    """A JSON file that must hold an object."""
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


def legacy_renamed(key: str) -> str:
    """A legacy LayerNorm key under transformers' current name."""
    for old, new in LEGACY_NORM_NAMES.items():
        if key.endswith(old):
            return key.removesuffix(old) + new
    return key


def tokenizer_lowercases(path: Path) -> bool:
    """Whether tokenizer.json lowercases, by sentence-transformers' own test: a Lowercase normalizer, alone or in a
    Sequence."""
    normalizer = read_object(path).get("normalizer")
    if not isinstance(normalizer, dict):
        return False
    parts = normalizer.get("normalizers") if normalizer.get("type") == "Sequence" else [normalizer]
    return isinstance(parts, list) and any(isinstance(p, dict) and p.get("type") == "Lowercase" for p in parts)
