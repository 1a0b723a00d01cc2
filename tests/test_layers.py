"""The layers import downwards only (docs/development.md, "Layers"): every import of every product module, at the top
or inside a function, absolute or relative, is read with ast (nothing is imported) and held to the layer order, so
that an upward import fails here with its file, line, the module it imports and both layers.

    base     attnserve's errors, config, progress, cache, the generated protobuf packages and the few leaves that
             every side shares (pooling modes, images decoded, attention analyses, the explorer's page)
    model    the self-written encoder, in torch                                  imports base
    engine   onnxruntime and numpy: serving's one engine (and default_model)     imports base; never torch
    client   the thin gRPC client                                                imports base
    export   torch -> ONNX, verified against the model                           imports model, engine
    server   the doors, the core, the batcher                                    imports engine
    offline  `encode`: its job driver, local, on Ray or through a server         imports engine, client
    top      the CLI, config_docs, server_process, loadtest                      imports anything

model and engine are siblings: the engine serves the graphs export made from the model without importing it (nor
torch). A module started as a process by its name (`python -m ...`) is the one way a lower layer reaches a higher
one: PROGRAMS lists each such name, where it is declared, and the test checks that the program is there.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The folders installed as attnserve.<name> (pyproject.toml's [tool.setuptools.package-dir]).
FOLDERS = {"attnserve": "attnserve", "model": "attnserve.model", "export": "attnserve.export",
           "engine": "attnserve.engine", "offline": "attnserve.offline", "server": "attnserve.server",
           "client": "attnserve.client", "loadtest": "attnserve.loadtest"}

# A module's layer: its own entry, else its package's (the nearest listed). attnserve itself (its __version__) is
# base; every other module of attnserve/ is listed by name, so that a new one is placed on purpose.
LAYERS = {
    "attnserve": "base", "attnserve.errors": "base", "attnserve.config": "base", "attnserve.progress": "base",
    "attnserve.cache": "base", "attnserve.pooling_modes": "base", "attnserve.build_program": "base",
    "attnserve.images": "base", "attnserve.attention_analyses": "base", "attnserve.patch_attention": "base",
    "attnserve.explorer_page": "base", "attnserve.v1": "base", "attnserve.kserve": "base", "attnserve.tei": "base",
    "attnserve.model": "model",
    # The default model's artifact directory, exported on first use through engine/builds.py's child process.
    "attnserve.engine": "engine", "attnserve.default_model": "engine",
    "attnserve.client": "client",
    "attnserve.export": "export",
    "attnserve.server": "server",
    "attnserve.offline": "offline",
    "attnserve.cli": "top", "attnserve.config_docs": "top", "attnserve.server_process": "top",
    "attnserve.loadtest": "top",
}
ALL = {"base", "model", "engine", "client", "export", "server", "offline", "top"}
MAY_IMPORT = {
    "base": {"base"},
    "model": {"base", "model"},
    "engine": {"base", "engine"},
    "client": {"base", "client"},
    "export": {"base", "model", "engine", "export"},
    "server": {"base", "engine", "server"},
    "offline": {"base", "engine", "client", "offline"},
    "top": ALL,
}
# What only the layers that build graphs may import: serving, encoding and the client never import torch.
EXPORT_ONLY = ("torch", "transformers", "safetensors", "sentence_transformers", "onnxscript")
MAY_IMPORT_EXPORT_ONLY = {"model", "export", "top"}

# Modules started as a process by their name, from below their layer: {the program: the module that names it}.
PROGRAMS = {"attnserve.export.build_process": "attnserve.build_program"}


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO)
    parts = FOLDERS[rel.parts[0]].split(".") + list(rel.parts[1:-1])
    return ".".join(parts if rel.name == "__init__.py" else [*parts, rel.stem])


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
    imports, strings = [], []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("attnserve."):
            strings.append((node.lineno, node.value))
    is_program = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
    return Module(name, path, path.name == "__init__.py", imports, strings, is_program)


@cache
def product() -> dict[str, Module]:
    """{attnserve.x.y: the module}, for every .py file of the product folders."""
    paths = {module_name(path): path for folder in FOLDERS for path in sorted((REPO / folder).rglob("*.py"))}
    return {name: read_module(name, path, path.read_bytes()) for name, path in paths.items()}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    return LAYERS.get(module)  # attnserve alone


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
    found = []
    for node in module.imports:
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif not node.level and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def named_modules(module: Module) -> list[tuple[int, str]]:
    """(line, module) of every string that is a module's name ("attnserve.x.y", or "attnserve.x.y:function"): a
    module started by its name. Packages are left out (a logger's name is its package's)."""
    modules = product()
    return sorted({(line, text.split(":")[0]) for line, text in module.strings
                   if text.split(":")[0] in modules and not modules[text.split(":")[0]].is_package})


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


def test_every_module_has_a_layer():
    assert not [m for m in product() if layer_of(m) is None], "place each in tests/test_layers.py LAYERS"


def test_layers_import_downwards_only():
    modules = product()
    wrong = []
    for module in modules.values():
        for line, target in imports_of(module):
            if target in modules or any(m.startswith(target + ".") for m in modules):
                complaint = upward(module, line, target)
            else:
                complaint = f"{where(module, line)} {target}: no such module of attnserve"
            if complaint:
                wrong.append(complaint)
    assert not wrong, "imports against the layer order (docs/development.md, Layers):\n" + "\n".join(wrong)


def test_serving_and_the_client_never_import_torch():
    wrong = [f"{where(module, line)} {name}: {module.name} ({layer_of(module.name)}) imports {name}"
             for module in product().values() if layer_of(module.name) not in MAY_IMPORT_EXPORT_ONLY
             for line, name in third_party_of(module) if name in EXPORT_ONLY]
    assert not wrong, "\n".join(wrong)


def test_a_module_started_by_its_name_is_a_declared_program():
    """A string that names a module (python -m NAME, importlib, "NAME:function") is an edge no import graph sees:
    held to the layers as an import is, but for the programs in PROGRAMS, each named where it is declared, and
    each a program (run as __main__) that imports its declaration, so that both ends meet there."""
    wrong, seen = [], set()
    for module in product().values():
        for line, name in named_modules(module):
            if PROGRAMS.get(name) == module.name:
                seen.add(name)
                continue
            complaint = upward(module, line, name, "names, to start,")
            if complaint:
                wrong.append(complaint + ": a program started from below is declared in tests/test_layers.py PROGRAMS")
    assert not wrong, "\n".join(wrong)
    assert seen == set(PROGRAMS), f"PROGRAMS not named where they are declared: {set(PROGRAMS) - seen}"
    for program, declared in PROGRAMS.items():
        assert product()[program].is_program, f"{program} has no `if __name__ == \"__main__\"`: it is started as one"
        assert declared in {name for _, name in imports_of(product()[program])}, \
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
