"""Export's graph steps in child processes (export/isolated.py): results, errors raised as they were, and a child
that fails reported in one line."""

from pathlib import Path

import pytest

from attnserve.errors import ArtifactError
from attnserve.export import isolated


@pytest.mark.parametrize("step, target, kwargs, error, message", [
    # int8's fallback depends on it: quantize_int8_measured raises ValueError when its search misses.
    ("reading an address", "ipaddress:ip_address", {"address": "nowhere"}, ValueError,
     "does not appear to be an IPv4 or IPv6 address"),
    ("fusing attention", "json:loads", {"s": "{"}, ArtifactError, r"^fusing attention failed: JSONDecodeError: "),
    ("fp16 conversion", "subprocess:call", {"args": ["sh", "-c", "kill -9 $PPID"]}, ArtifactError,
     r"^fp16 conversion: its child process was killed by SIGKILL \(out of memory\?\)\Z"),
], ids=["a ValueError is raised as itself", "other errors name the step", "a killed child names the step"])
def test_a_failing_step_is_one_line(step, target, kwargs, error, message):
    with pytest.raises(error, match=message) as e:
        isolated.run(step, target, kwargs)
    assert "\n" not in str(e.value)


def announcing(on_stage, n):
    """A step that announces its stages, as quantize_int8_measured does."""
    for i in range(n):
        on_stage(f"stage {i}")
    return n


def test_stages_are_told_as_they_start(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent.parent))  # the child imports this module
    stages: list[str] = []
    assert isolated.run("a step", f"{__name__}:announcing", {"n": 2, "_on_stage": True}, stages.append) == 2
    assert stages == ["stage 0", "stage 1"]


@pytest.mark.parametrize("forks", [True, False], ids=["forked", "fresh-interpreter"])
def test_both_ways_of_starting_a_child_answer_alike(monkeypatch, forks):
    """Forked from the zygote, or (where there is no fork) a fresh interpreter: the same answers (the result comes
    back as JSON) and failures."""
    monkeypatch.setattr(isolated, "FORKS", forks)
    assert isolated.run("parsing", "json:loads", {"s": '{"a": [1, 2.5]}'}) == {"a": [1, 2.5]}
    with pytest.raises(ArtifactError) as e:
        isolated.run("a step", "no_such_module:step", {})
    assert str(e.value) == ("a step: its child process exited with status 1: "
                            "ModuleNotFoundError: No module named 'no_such_module'")


def test_a_dead_zygote_is_started_again():
    isolated.run("parsing", "json:loads", {"s": "1"})
    assert isolated._zygote is not None
    isolated._zygote.process.kill()
    isolated._zygote.process.wait()
    assert isolated.run("parsing", "json:loads", {"s": "2"}) == 2
