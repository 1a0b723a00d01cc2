"""FlagEmbedding's modules, imported with its packages' __init__ files left out: FlagEmbedding 1.4.2's package
__init__ imports a reranker module written for transformers 4 (gone in 5); the modules the tests run (M3Embedder,
the decoder-only reranker, tokenizer_compat) run on 5, their code unchanged. One loader for every test: the packages
it puts in sys.modules carry a spec, so that whichever test runs first in a worker, the next finds them."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

import pytest


def _root() -> Path:
    """FlagEmbedding's folder: the package already standing in sys.modules (put there here), else the installed one."""
    loaded = sys.modules.get("FlagEmbedding")
    if loaded is not None and getattr(loaded, "__path__", None):
        return Path(list(loaded.__path__)[0])
    spec = importlib.util.find_spec("FlagEmbedding")
    if spec is None or spec.submodule_search_locations is None:
        pytest.skip("FlagEmbedding is not installed (attnserve[dev] installs it)")
    return Path(list(spec.submodule_search_locations)[0])


def flag_module(name: str):
    """FlagEmbedding's module `name` (dotted, from FlagEmbedding), its parent packages empty stand-ins."""
    root = _root()
    parts = name.split(".")
    for i in range(1, len(parts)):
        package_name = ".".join(parts[:i])
        if package_name not in sys.modules:
            package = types.ModuleType(package_name)
            package.__path__ = [str(root.joinpath(*parts[1:i]))]
            package.__spec__ = importlib.machinery.ModuleSpec(package_name, None, is_package=True)
            package.__spec__.submodule_search_locations = package.__path__
            sys.modules[package_name] = package
    return importlib.import_module(name)
