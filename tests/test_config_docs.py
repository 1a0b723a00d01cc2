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
CONFIGS = [EngineConfig, ServerConfig, ClientConfig, LoadTestConfig]


def test_the_page_is_the_generated_one_with_every_setting_and_every_flag_a_section_each():
    page, written = generate(), PAGE.read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(written.splitlines(True), page.splitlines(True), "docs/configuration.md",
                                        "generated", n=1))
    assert written == page, f"docs/configuration.md is out of date; regenerate it with:\n    {COMMAND}\n{diff}"
    assert [cls for cls in config_classes() if cls in CONFIGS] == CONFIGS
    for f in (f for cls in CONFIGS for f in dataclasses.fields(cls)):
        assert f"`--{f.name.replace('_', '-')}`" in page and f"`{f.metadata['env']}`" in page, f.name
    for sub in next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices.values():
        for flag in (flag for action in sub._actions for flag in action.option_strings):
            assert flag in ("-h", "--help") or f"`{flag}`" in page, flag


def test_a_new_setting_appears_with_its_flag_environment_and_default():
    """What the lead relies on at merge: a field added to a dataclass shows up on regeneration."""
    @dataclasses.dataclass
    class Extra:
        auto_truncate: bool = setting(True, "ATTNSERVE_AUTO_TRUNCATE", "cut over-length inputs")

    parser = argparse.ArgumentParser(prog="attnserve")
    add_arguments(parser.add_subparsers(dest="command").add_parser("serve"), Extra)
    page = generate(parser, [*config_classes(), Extra])
    row = "| `--auto-truncate`, `--no-auto-truncate` | `ATTNSERVE_AUTO_TRUNCATE` | on | cut over-length inputs |"
    assert row in page
    assert "### Extra settings (`attnserve serve`)" in page
