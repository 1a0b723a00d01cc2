"""docs/configuration.md is what attnserve.config_docs generates from the config dataclasses and the CLI."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
from pathlib import Path

from attnserve.cli import build_parser
from attnserve.config import ClientConfig, EngineConfig, LoadTestConfig, ServerConfig, add_arguments, setting
from attnserve.config_docs import COMMAND, config_classes, generate

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_the_configuration_page_is_the_generated_one():
    expected, written = generate(), PAGE.read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(written.splitlines(True), expected.splitlines(True), "docs/configuration.md",
                                        "generated", n=1))
    assert written == expected, f"docs/configuration.md is out of date; regenerate it with:\n    {COMMAND}\n{diff}"


def test_every_setting_and_every_flag_is_on_the_page():
    page = generate()
    for cls in (EngineConfig, ServerConfig, ClientConfig, LoadTestConfig):
        for f in dataclasses.fields(cls):
            assert f"`--{f.name.replace('_', '-')}`" in page and f"`{f.metadata['env']}`" in page, f.name
    for sub in next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices.values():
        for action in sub._actions:
            for flag in action.option_strings:
                assert flag in ("-h", "--help") or f"`{flag}`" in page, flag


def test_a_new_setting_appears_with_its_flag_environment_and_default():
    """What the lead relies on at merge: a field added to a dataclass shows up on regeneration."""
    @dataclasses.dataclass
    class Extra:
        auto_truncate: bool = setting(True, "ATTNSERVE_AUTO_TRUNCATE", "cut over-length inputs")

    parser = argparse.ArgumentParser(prog="attnserve")
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve")
    add_arguments(serve, Extra)
    page = generate(parser, [*config_classes(), Extra])
    assert ("| `--auto-truncate`, `--no-auto-truncate` | `ATTNSERVE_AUTO_TRUNCATE` | on | cut over-length inputs |"
            in page) and "### Extra settings (`attnserve serve`)" in page


def test_every_config_dataclass_is_a_section():
    found = config_classes()
    assert [cls for cls in found if cls in (EngineConfig, ServerConfig, ClientConfig, LoadTestConfig)] == [
        EngineConfig, ServerConfig, ClientConfig, LoadTestConfig]
