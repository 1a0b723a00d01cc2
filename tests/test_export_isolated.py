"""Export's graph steps in child processes (export/isolated.py): results, errors raised as they were, and a child
that fails reported in one line."""

from pathlib import Path

import pytest

from attnserve.errors import ArtifactError
from attnserve.export import isolated


def test_result_comes_back_as_json():
    assert isolated.run("parsing", "json:loads", {"s": '{"a": [1, 2.5]}'}) == {"a": [1, 2.5]}


def test_value_error_is_raised_as_itself():
    # int8's fallback depends on it: quantize_int8_measured raises ValueError when its search misses.
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 address"):
        isolated.run("reading an address", "ipaddress:ip_address", {"address": "nowhere"})


def test_other_errors_name_the_step_in_one_line():
    with pytest.raises(ArtifactError) as e:
        isolated.run("fusing attention", "json:loads", {"s": "{"})
    assert str(e.value).startswith("fusing attention failed: JSONDecodeError: ")
    assert "\n" not in str(e.value)


def test_a_killed_child_is_one_line_naming_the_step():
    with pytest.raises(ArtifactError) as e:
        isolated.run("fp16 conversion", "subprocess:call", {"args": ["sh", "-c", "kill -9 $PPID"]})
    assert str(e.value) == "fp16 conversion: its child process was killed by SIGKILL (out of memory?)"


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
    """Forked from the zygote, or (where there is no fork) a fresh interpreter: the same answers and failures."""
    monkeypatch.setattr(isolated, "FORKS", forks)
    assert isolated.run("parsing", "json:loads", {"s": "[3]"}) == [3]
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
