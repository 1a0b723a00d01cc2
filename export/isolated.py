"""Export's graph steps in a child process of their own, so that what they hold dies with them.

onnxruntime's transformer optimizer, its fp16 converter and its quantizer hold a graph several times over (its
protobuf, the model they build, the serialized copy they write, shape inference's copies), and glibc keeps much
of what they free: on all-mpnet-base-v2 (0.41 GiB of fp32 weights), `optimize_model` alone left 2.1 GiB resident
in the export's process. Run in a child, a step's peak is its own and ends with it; the export's process meanwhile
holds only what verification needs later.

The children are forked from a zygote, `python -m attnserve.export.isolated <socket fd>`, started once per process
on its first step: it imports numpy, onnx and sympy (onnxruntime's optimizer imports sympy: 0.5 s of a step's
0.6 s of start-up CPU), and nothing that starts threads but numpy's BLAS (onnxruntime itself, which starts one on
import, is imported by each child). For each step the parent sends it two pipes (SCM_RIGHTS); it forks a
supervisor, which forks the step's child and writes the child's exit status after the child's own messages. The
child takes the parent's environment and sys.path as they are at the call, imports the step's function ("module:
name"), calls it with the JSON arguments and writes JSON lines: {"stage": ...} for each progress stage the step
announces, then {"result": ...}, or {"error": type, "message": ...} when it raises. Where there is no fork, the
child is a fresh interpreter (`-m attnserve.export.isolated --step`) speaking the same lines on stdin and stdout.

The errors export acts on (ValueError: int8's fallback; attnserve's own errors) are raised again in the parent as
they were; anything else, or a child that dies (killed for memory), is an ArtifactError of one line naming the
step, with the last line the child wrote to its stderr.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from attnserve import errors
from attnserve.errors import ArtifactError

# Errors raised again in the parent as the type they were in the child (export's own handling depends on them).
RAISED_AS_IS = {"ValueError": ValueError, **{name: getattr(errors, name) for name in dir(errors)
                                             if isinstance(getattr(errors, name), type)
                                             and issubclass(getattr(errors, name), Exception)}}
# What the zygote imports once. Not onnxruntime: it starts a thread on import, and a fork keeps only the caller's.
PRELOADED = ("numpy", "onnx", "sympy", "attnserve.export.optimize")
FORKS = hasattr(os, "fork") and hasattr(socket, "send_fds")


class _Zygote:
    """The process the steps' children are forked from, and the socket their pipes are sent on."""

    def __init__(self) -> None:
        ours, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with its:
            self.process = subprocess.Popen([sys.executable, "-m", "attnserve.export.isolated", str(its.fileno())],
                                            pass_fds=[its.fileno()], stdin=subprocess.DEVNULL)
        self.socket = ours

    def fork(self, requests: int, replies: int) -> None:
        socket.send_fds(self.socket, [b"step"], [requests, replies])


_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()


def _forked(requests: int, replies: int) -> None:
    """The step's child forked from the zygote (started, or started again if it has died, here)."""
    global _zygote
    with _zygote_lock:
        for attempt in range(2):
            if _zygote is None or _zygote.process.poll() is not None:
                _zygote = _Zygote()
            try:
                _zygote.fork(requests, replies)
                return
            except OSError:
                if attempt:
                    raise
                _zygote = None


@contextlib.contextmanager
def _child(request: bytes) -> Iterator[tuple[IO[bytes], Callable[[], int | None]]]:
    """A started step child, its replies (lines) and a function that gives its exit status once they end (None:
    the supervisor's line tells it)."""
    if not FORKS:
        child = subprocess.Popen([sys.executable, "-m", "attnserve.export.isolated", "--step"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert child.stdin is not None and child.stdout is not None
        with child.stdout:
            _write_all(child.stdin, request)
            yield child.stdout, child.wait
        return
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    try:
        _forked(requests_read, replies_write)
    finally:
        os.close(requests_read)
        os.close(replies_write)
    with open(replies_read, "rb") as replies, open(requests_write, "wb") as requests:
        _write_all(requests, request)
        requests.close()
        yield replies, lambda: None


def _write_all(pipe: IO[bytes], data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError):  # a child that died first: its status says why
        pipe.write(data)
        pipe.close()


def run(what: str, function: str, kwargs: dict[str, Any], on_stage: Callable[[str], None] = lambda what: None
        ) -> Any:
    """function ("module:name") called with kwargs (JSON) in a child process; its JSON result. what names the step
    in a failure's message. on_stage: the stages the step announces (its on_stage argument), as they start."""
    with tempfile.NamedTemporaryFile(prefix="attnserve-step-", suffix=".stderr") as stderr:
        request = json.dumps({"function": function, "kwargs": kwargs, "environment": dict(os.environ),
                              "path": sys.path, "stderr": stderr.name}).encode()
        answer: dict[str, Any] | None = None
        code: int | None = None
        with _child(request) as (replies, exit_status):
            for line in replies:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a child that died writing it: its exit status says why
                if "stage" in message:
                    on_stage(message["stage"])
                elif "exit" in message:
                    code = message["exit"]
                else:
                    answer = message
            code = exit_status() if code is None else code
        if answer is not None and "error" in answer:
            kind = RAISED_AS_IS.get(answer["error"])
            if kind is not None:
                raise kind(answer["message"])
            raise ArtifactError(f"{what} failed: {answer['error']}: {answer['message']}")
        if code != 0 or answer is None:
            tail = [line.strip() for line in Path(stderr.name).read_text("utf-8", "replace").splitlines()
                    if line.strip()]
            why = ("ended without an answer" if code is None else
                   f"was killed by {signal.Signals(-code).name}" + (" (out of memory?)" if code == -9 else "")
                   if code < 0 else f"exited with status {code}")
            raise ArtifactError(f"{what}: its child process {why}" + (f": {tail[-1]}" if tail else ""))
        return answer["result"]


def _plain(value: Any) -> Any:
    """numpy's numbers and arrays as JSON's."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _step(requests: IO[bytes], replies: IO[bytes]) -> None:
    """The child: reads its request, takes the parent's environment and sys.path, sends its stdout and stderr
    (libraries' prints, native code's too) to the file the parent reads when the step fails, runs the step."""
    request = json.loads(requests.read())
    requests.close()
    os.environ.clear()
    os.environ.update(request["environment"])
    sys.path[:] = request["path"]
    written = os.open(request["stderr"], os.O_WRONLY | os.O_APPEND)
    os.dup2(written, 1)
    os.dup2(written, 2)
    os.close(written)

    def say(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message, default=_plain).encode() + b"\n")
        replies.flush()

    kwargs = request["kwargs"]
    module, name = request["function"].split(":")
    step = getattr(importlib.import_module(module), name)
    if kwargs.pop("_on_stage", False):
        kwargs["on_stage"] = lambda what: say({"stage": what})
    try:
        result = step(**kwargs)
    except Exception as e:  # reported to the parent, which raises it
        say({"error": type(e).__name__, "message": str(e)})
        return
    say({"result": result})


def _supervise(requests: int, replies: int) -> None:
    """Forked by the zygote: forks the step's child, waits for it, and writes its exit status last."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        code = 1
        try:
            with open(requests, "rb") as requests_file, open(replies, "wb") as replies_file:
                _step(requests_file, replies_file)
            code = 0
        except BaseException:
            traceback.print_exc()  # its last line is the parent's message
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(requests)
    _, status = os.waitpid(child, 0)
    with contextlib.suppress(OSError):  # the parent has gone
        os.write(replies, json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    os._exit(0)


def _serve(fd: int) -> None:
    """The zygote: imports PRELOADED, then forks a supervisor for each step it is sent, until the parent closes
    the socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C stops the parent; its closed socket then stops this
    for name in PRELOADED:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the supervisors are reaped by the kernel
    with socket.socket(fileno=fd) as parent:
        while True:
            message, fds, _, _ = socket.recv_fds(parent, 16, 2)
            if not message:
                return
            if os.fork() == 0:
                try:
                    parent.close()
                    _supervise(*fds)
                finally:
                    os._exit(1)  # never back into this loop: the zygote is the parent
            for received in fds:
                os.close(received)


if __name__ == "__main__":
    if sys.argv[1] == "--step":
        _step(sys.stdin.buffer, os.fdopen(os.dup(1), "wb"))  # the replies' own descriptor: fd 1 becomes stderr's
    else:
        _serve(int(sys.argv[1]))
