"""The command line's manners (issue 45): a mistyped argument is one line with its likely fix, not the whole usage;
output piped into a reader that stops early (`| head`) ends quietly; the venv the README creates in the clone is
ignored by git."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from attnserve.cli import build_parser, main
from attnserve.server_process import CLI

from .conftest import run_cli

REPOSITORY = Path(__file__).resolve().parents[1]


def commands() -> list[str]:
    parser = build_parser()
    return list(next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices)


def test_an_invalid_choice_is_one_line_naming_the_closest():
    result = run_cli("serve", "--long-inputs", "chunks")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "usage:" not in result.stderr, result.stderr
    assert result.stderr.startswith("attnserve serve: error: argument --long-inputs: invalid choice: 'chunks'")
    assert result.stderr.rstrip().endswith("did you mean chunk?"), result.stderr


def test_the_commands_design_promises_exist():
    assert {"export", "encode", "serve", "embed", "attention", "loadtest", "health"} <= set(commands())


@pytest.mark.parametrize("command", commands())
def test_every_command_has_help_and_says_an_argument_error_in_one_line(command, capsys):
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0 and "usage: attnserve " + command in capsys.readouterr().out
    for argv, hint in (([command, "--log-level", "LOUD"], f"`attnserve {command} --help` lists what it takes"),
                       ([command, "--log-level", "INF"], "did you mean INFO?")):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"attnserve {command}: error: argument --log-level: "), err
        assert err.rstrip().endswith(hint), err


def test_a_missing_argument_or_command_is_one_line(capsys):
    for argv, said in ((["embed"], "attnserve embed: error: the following arguments are required: TEXT; "),
                       ([], "attnserve: error: the following arguments are required: COMMAND; "),
                       (["serv"], "attnserve: error: argument COMMAND: invalid choice: 'serv'")):
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(said), err
    assert capsys.readouterr().err == ""


def closed_pipe() -> int:
    """The writing end of a pipe whose reader is gone, as `| head` leaves it once head has its lines."""
    read, write = os.pipe()
    os.close(read)
    return write


def run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    write = closed_pipe()
    try:
        return subprocess.run([*CLI, *args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)


def test_embed_into_a_reader_gone_exits_quietly(server):
    result = run_into_closed_pipe("embed", *(f"text number {i}" for i in range(40)), "--target", server.target)
    assert result.stderr == "", result.stderr  # no BrokenPipeError, no "Exception ignored"
    assert result.returncode == 141  # as a tool killed by SIGPIPE: 128 + 13


def test_help_into_a_reader_gone_exits_quietly():
    result = run_into_closed_pipe("serve", "--help")
    assert result.stderr == "", result.stderr


@pytest.mark.skipif(shutil.which("git") is None or not (REPOSITORY / ".git").exists(),
                    reason="needs git and the repository's clone")
def test_the_venv_the_readme_creates_is_ignored_by_git():
    assert "python -m venv .venv" in (REPOSITORY / "README.md").read_text()
    for path in (".venv/", ".venv/bin/python", ".venv/lib/python3.11/site-packages/numpy/__init__.py"):
        ignored = subprocess.run(["git", "check-ignore", "--quiet", "--no-index", path], cwd=REPOSITORY)
        assert ignored.returncode == 0, f"{path} is not ignored by .gitignore"
