"""What the CLI accepts, for the tests of files that run it: a command line, and an environment of settings."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import shlex
from unittest import mock

from attnserve import config as config_module
from attnserve.cli import build_parser
from attnserve.errors import ConfigError


def cli_error(argv: list[str]) -> str | None:
    """None when the CLI's parser accepts argv; otherwise what it said."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as e:
        said = err.getvalue().strip().splitlines()
        return f"`attnserve {shlex.join(argv)}`: {said[-1] if said else f'exit {e.code}'}"
    return None


def config_dataclasses() -> list[type]:
    """Every dataclass in attnserve/config.py whose fields name environment variables."""
    return [cls for cls in vars(config_module).values()
            if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == config_module.__name__
            and any("env" in f.metadata for f in dataclasses.fields(cls))]


def known_environment() -> set[str]:
    names = {f.metadata["env"] for cls in config_dataclasses() for f in dataclasses.fields(cls) if "env" in f.metadata}
    return names | {"ATTNSERVE_CACHE"}  # default_model.py: where the default model's artifacts are cached


def configuration_errors(env: dict[str, str]) -> list[str]:
    """Reads every settings dataclass the way the CLI does (their checks included) with env's ATTNSERVE_*
    variables as the only ones set; what it refuses."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSERVE_")}
    clean |= {k: str(v) for k, v in env.items() if k.startswith("ATTNSERVE_")}
    errors = []
    with mock.patch.dict(os.environ, clean, clear=True):
        for cls in config_dataclasses():
            try:
                config_module.from_args(cls, argparse.Namespace())
            except ConfigError as e:
                errors.append(f"{cls.__name__}: {e}")
    return errors
