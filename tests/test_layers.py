"""The layers import downwards only (docs/development.md, "Layers"): every import of every product module, at the top
or in a function, absolute or relative, read with ast (nothing imported), is held to the layer order, and an upward
one fails with its file, line, the module it imports and both layers. model and engine are siblings: the engine
serves the graphs export made from the model without importing it, nor torch. A module started as a process by its
name (`python -m ...`) is the one way a lower layer reaches a higher one: PROGRAMS declares each.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The folders installed as attnserve.<name> (pyproject.toml's [tool.setuptools.package-dir]).
FOLDERS = {"attnserve": "attnserve", **{name: f"attnserve.{name}" for name in (
    "model", "export", "engine", "offline", "server", "client", "loadtest")}}
# A module's layer: its own entry, else its nearest listed package's. attnserve itself (its __version__) is base;
# every other module of attnserve/ is listed by name, so that a new one is placed on purpose. base holds the leaves
# every side shares (errors, config, the generated protobuf packages, pooling modes, images, attention analyses,
# the explorer's page); engine holds default_model too, whose artifacts engine/builds.py exports on first use; top
# holds the CLI, config_docs, server_process and loadtest.
LAYERS = {
    **dict.fromkeys([f"attnserve{name}" for name in (
        "", ".errors", ".config", ".progress", ".cache", ".pooling_modes", ".build_program", ".images",
        ".attention_analyses", ".patch_attention", ".explorer_page", ".v1", ".kserve", ".tei")], "base"),
    "attnserve.model": "model", "attnserve.engine": "engine", "attnserve.default_model": "engine",
    "attnserve.client": "client", "attnserve.export": "export", "attnserve.server": "server",
    "attnserve.offline": "offline", "attnserve.cli": "top", "attnserve.config_docs": "top",
    "attnserve.server_process": "top", "attnserve.loadtest": "top",
}
MAY_IMPORT = {"base": {"base"}, "model": {"base", "model"}, "engine": {"base", "engine"}, "client": {"base", "client"},
              "export": {"base", "model", "engine", "export"}, "server": {"base", "engine", "server"},
              "offline": {"base", "engine", "client", "offline"}, "top": set(LAYERS.values())}
# What only the layers that build graphs may import: serving, encoding and the client never import torch.
EXPORT_ONLY = ("torch", "transformers", "safetensors", "sentence_transformers", "onnxscript")
MAY_IMPORT_EXPORT_ONLY = {"model", "export", "top"}
# Modules started as a process by their name, from below their layer: {the program: the module that names it}.
PROGRAMS = {"attnserve.export.build_process": "attnserve.build_program"}


@dataclass(frozen=True)
class Module:
    """What this test reads of a module, in one walk of its tree."""

    name: str
    path: Path
    is_package: bool
    imports: list[ast.Import | ast.ImportFrom]  # at the top or in a function
    strings: list[tuple[int, str]]  # (line, text) of its strings that start "attnserve."
    is_program: bool  # it has `if __name__ == "__main__":`


def read_module(name: str, path: Path, source: str | bytes) -> Module:
    tree = ast.parse(source, filename=str(path))
    nodes = list(ast.walk(tree))
    imports = [n for n in nodes if isinstance(n, (ast.Import, ast.ImportFrom))]
    strings = [(n.lineno, n.value) for n in nodes
               if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("attnserve.")]
    is_program = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
    return Module(name, path, path.name == "__init__.py", imports, strings, is_program)


@cache
def product() -> dict[str, Module]:
    """{attnserve.x.y: the module}, for every .py file of the product folders."""
    modules = {}
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO)
            parts = [*FOLDERS[rel.parts[0]].split("."), *rel.parts[1:-1]]
            name = ".".join(parts if rel.name == "__init__.py" else [*parts, rel.stem])
            modules[name] = read_module(name, path, path.read_bytes())
    return modules


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return next((LAYERS[".".join(parts[:n])] for n in range(len(parts), 1, -1) if ".".join(parts[:n]) in LAYERS),
                LAYERS.get(module))  # attnserve alone


def imports_of(module: Module) -> list[tuple[int, str]]:
    """(line, module) of every attnserve module it imports; `from X import name` counts as X.name where that is a
    module, and a relative import as the absolute name it reaches."""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    found = set()
    for node in module.imports:
        if isinstance(node, ast.Import):
            found |= {(node.lineno, alias.name) for alias in node.names}
            continue
        source = node.module or ""
        if node.level:
            parts = package.split(".")
            source = ".".join([*parts[:len(parts) - (node.level - 1)], *([node.module] if node.module else [])])
        found |= {(node.lineno, f"{source}.{alias.name}" if f"{source}.{alias.name}" in product() else source)
                  for alias in node.names}
    return sorted((line, name) for line, name in found if name == "attnserve" or name.startswith("attnserve."))


def third_party_of(module: Module) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import."""
    return [(node.lineno, name.split(".")[0]) for node in module.imports
            for name in ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module] if not node.level and node.module else [])]


def where(module: Module, line: int) -> str:
    return f"{module.path.relative_to(REPO)}:{line}"


def upward(module: Module, line: int, target: str, how: str = "imports") -> str | None:
    """The complaint about module importing target at line, or None where the layers allow it."""
    mine, theirs = layer_of(module.name), layer_of(target)
    if mine is None or theirs is None:
        return f"{where(module, line)} {target}: {module.name if mine is None else target} has no layer (LAYERS)"
    if theirs not in MAY_IMPORT[mine]:
        return f"{where(module, line)} {target}: {module.name} ({mine}) {how} {target} ({theirs})"
    return None


def test_every_module_has_a_layer_and_imports_downwards_only():
    modules = product()
    assert not [m for m in modules if layer_of(m) is None], "place each in tests/test_layers.py LAYERS"
    wrong = [upward(module, line, target) if target in modules or any(m.startswith(target + ".") for m in modules)
             else f"{where(module, line)} {target}: no such module of attnserve"
             for module in modules.values() for line, target in imports_of(module)]
    wrong = [complaint for complaint in wrong if complaint]
    assert not wrong, "imports against the layer order (docs/development.md, Layers):\n" + "\n".join(wrong)


def test_serving_and_the_client_never_import_torch():
    wrong = [f"{where(module, line)} {name}: {module.name} ({layer_of(module.name)}) imports {name}"
             for module in product().values() if layer_of(module.name) not in MAY_IMPORT_EXPORT_ONLY
             for line, name in third_party_of(module) if name in EXPORT_ONLY]
    assert not wrong, "\n".join(wrong)


def test_a_module_started_by_its_name_is_a_declared_program():
    """A string that names a module (python -m NAME, importlib, "NAME:function"; packages left out: a logger's name is
    its package's) is an edge no import graph sees: held to the layers as an import is, but for the programs in
    PROGRAMS, each named where it is declared, and each a program (run as __main__) that imports its declaration."""
    modules, wrong, seen = product(), [], set()
    for module in modules.values():
        for line, name in sorted({(line, text.split(":")[0]) for line, text in module.strings}):
            if name not in modules or modules[name].is_package:
                continue
            if PROGRAMS.get(name) == module.name:
                seen.add(name)
            elif complaint := upward(module, line, name, "names, to start,"):
                wrong.append(complaint + ": a program started from below is declared in tests/test_layers.py PROGRAMS")
    assert not wrong, "\n".join(wrong)
    assert seen == set(PROGRAMS), f"PROGRAMS not named where they are declared: {set(PROGRAMS) - seen}"
    for program, declared in PROGRAMS.items():
        assert modules[program].is_program, f"{program} has no `if __name__ == \"__main__\"`: it is started as one"
        assert declared in {name for _, name in imports_of(modules[program])}, \
            f"{program} does not import {declared}, which declares its name and protocol"


@pytest.mark.parametrize(("name", "source", "expected"), [
    ("attnserve.model.pooling", "from attnserve.engine.pooling import POOLING_MODES", "(model) imports"),
    ("attnserve.server.app", "def f():\n    from attnserve.export import verify", "(server) imports"),
    ("attnserve.client.client", "from ..server.http import explorer", "(client) imports"),
    ("attnserve.engine.builds", "from attnserve import cli", "(engine) imports attnserve.cli (top)"),
    ("attnserve.offline.job", "from attnserve.offline import rows", None),
])
def test_an_upward_import_is_found(name, source, expected):
    module = read_module(name, product()[name].path, source)
    complaints = [upward(module, line, target) for line, target in imports_of(module)]
    if expected is None:
        assert complaints == [None]
    else:
        assert complaints and all(c and expected in c for c in complaints), complaints
