"""Export's graph steps in a child process of their own, so that what they hold dies with them.

onnxruntime's transformer optimizer, its fp16 converter and its quantizer hold a graph several times over (its
protobuf, the model they build, the serialized copy they write, shape inference's copies), and glibc keeps much
of what they free: on all-mpnet-base-v2 (0.41 GiB of fp32 weights), `optimize_model` alone left 2.1 GiB resident
in the export's process. Run in a child, a step's peak is its own and ends with it; the export's process meanwhile
holds only what verification needs later.

The child is `python -m attnserve.export.isolated`: it imports the step's function (by "module:name"), calls it
with the JSON arguments it reads on stdin, and writes JSON lines on stdout: {"stage": ...} for each progress
stage the step announces, then {"result": ...}, or {"error": type, "message": ...} when it raises. The errors
export acts on (ValueError: int8's fallback; attnserve's own errors) are raised again in the parent as they were;
anything else, or a child that dies (killed for memory), is an ArtifactError of one line naming the step.

The child imports no more than the step needs (no torch): its memory is the step's.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from attnserve import errors
from attnserve.errors import ArtifactError

# Errors raised again in the parent as the type they were in the child (export's own handling depends on them).
RAISED_AS_IS = {"ValueError": ValueError, **{name: getattr(errors, name) for name in dir(errors)
                                             if isinstance(getattr(errors, name), type)
                                             and issubclass(getattr(errors, name), Exception)}}


def run(what: str, function: str, kwargs: dict[str, Any], on_stage: Callable[[str], None] = lambda what: None
        ) -> Any:
    """function ("module:name") called with kwargs (JSON) in a child process; its JSON result. what names the step
    in a failure's message. on_stage: the stages the step announces (its on_stage argument), as they start."""
    with tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen([sys.executable, "-m", "attnserve.export.isolated", function],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps(kwargs))
        child.stdin.close()
        answer: dict[str, Any] | None = None
        for line in child.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue  # a library's print
            if not isinstance(message, dict):
                continue
            if "stage" in message:
                on_stage(message["stage"])
            elif "result" in message or "error" in message:
                answer = message
        code = child.wait()
        if answer is not None and "error" in answer:
            kind = RAISED_AS_IS.get(answer["error"])
            if kind is not None:
                raise kind(answer["message"])
            raise ArtifactError(f"{what} failed: {answer['error']}: {answer['message']}")
        if code != 0 or answer is None:
            stderr.seek(0)
            tail = [line.strip() for line in stderr.read().decode("utf-8", "replace").splitlines() if line.strip()]
            why = (f"was killed by {signal.Signals(-code).name}" + (" (out of memory?)" if code == -9 else "")
                   if code < 0 else f"exited with status {code}")
            raise ArtifactError(f"{what}: its child process {why}" + (f": {tail[-1]}" if tail else ""))
        return answer["result"]


def _plain(value: Any) -> Any:
    """numpy's numbers and arrays as JSON's."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _main(function: str) -> int:
    out = sys.stdout
    sys.stdout = sys.stderr  # libraries' prints must not mix with the answer

    def say(message: dict[str, Any]) -> None:
        out.write(json.dumps(message, default=_plain) + "\n")
        out.flush()

    kwargs = json.loads(sys.stdin.read())
    module, name = function.split(":")
    step = getattr(importlib.import_module(module), name)
    if kwargs.pop("_on_stage", False):
        kwargs["on_stage"] = lambda what: say({"stage": what})
    try:
        result = step(**kwargs)
    except Exception as e:  # reported to the parent, which raises it
        say({"error": type(e).__name__, "message": str(e)})
        return 0
    say({"result": result})
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
