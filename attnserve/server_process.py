"""A real `attnserve serve` process on loopback ports, as a user starts it: for the tests and the benchmarks.

It lives in the package rather than under tests/ so that one helper serves both: the benchmarks are run
as `python bench/bench_x.py` from any folder, and import it like the rest of attnserve, with no sys.path
set-up and no benchmark depending on the test folder.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from attnserve.client.client import CHANNEL_OPTIONS
from attnserve.client.health import NotServing, wait_until_serving
from attnserve.v1 import encoder_pb2_grpc

# `attnserve` as this Python runs it, whatever is on PATH.
CLI = (sys.executable, "-m", "attnserve.cli")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now. Another process may take it before the server binds it; the server
    then exits with "cannot listen on", which wait_serving reports within seconds, with the server's log."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    """`attnserve serve` in a subprocess, started at once; wait_serving() until it serves, terminate() drains it.

    Ports are chosen here, not by the server (port 0), so that several replicas can share one port on
    different loopback addresses, as containers behind one service name do.
    """

    def __init__(self, artifacts: Path | None, *flags: str, env: dict[str, str | None] | None = None,
                 log_path: Path | None = None, host: str = "127.0.0.1", port: int | None = None,
                 metrics_port: int | None = None, http_port: int | None = None, launcher: Sequence[str] = CLI,
                 cwd: Path | None = None):
        """artifacts None: serve the default model from the cache, as `attnserve serve` alone does.
        env: variables set on top of this process's environment; None unsets one (e.g. ATTNSERVE_THREADS).
        log_path None: the server's output goes to an anonymous temporary file, still read by log_tail().
        port, metrics_port, http_port None: free ones (http_port -1: no HTTP door). launcher: the command that
        runs the attnserve CLI."""
        self.host = host
        # The ports chosen here, not given: those a start that lost its port to another process picks again.
        self._chosen = {name for name, given in (("port", port), ("metrics_port", metrics_port),
                                                  ("http_port", http_port)) if not given}
        self.port, self.metrics_port = port or free_port(host), metrics_port or free_port(host)
        self.http_port = http_port or free_port(host)
        self.log_path = log_path
        self._log = open(log_path, "w+b") if log_path else tempfile.TemporaryFile()
        self.served = False  # wait_serving() saw it serve: only then has it a drain to test
        self._launch = (artifacts, flags, launcher, cwd, env)
        self._start()

    def _start(self) -> None:
        artifacts, flags, launcher, cwd, env = self._launch
        host = self.host
        self.target = f"{'localhost' if host == '127.0.0.1' else host}:{self.port}"
        self.metrics_url = f"http://{host}:{self.metrics_port}/metrics"
        self.http_url = f"http://{f'[{host}]' if ':' in host else host}:{self.http_port}"
        self.command = [*launcher, "serve", *(["--artifacts", str(artifacts)] if artifacts else []), "--host", host,
                        "--port", str(self.port), "--metrics-port", str(self.metrics_port),
                        "--http-port", str(self.http_port), *flags]
        environment = {**os.environ, **(env or {})}
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            self.command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, cwd=cwd,
            env={k: v for k, v in environment.items() if v is not None})

    def _lost_a_port(self) -> bool:
        """It exited because another process took a port chosen here between free_port() and its bind."""
        if self.process.poll() is None or not self._chosen:
            return False
        tail = self.log_tail(3)
        return "cannot listen on" in tail and "Address already in use" in tail

    def wait_serving(self, credentials: grpc.ChannelCredentials | None = None, timeout: float = 120) -> None:
        """Until its health service says SERVING (only after warm-up); timeout counts from the start.
        Raises NotServing, with the server's last log lines, if it exits or the time runs out first. A start
        that lost a port chosen here to another process (free_port's race) is made again on fresh ports, twice at
        most: target and the URLs are read after this returns."""
        for attempt in range(3):
            exited = lambda: None if self.process.poll() is None else f"it exited with {self.process.returncode}"
            with self.channel(credentials) as channel:
                try:
                    wait_until_serving(channel, self.target, max(0.0, self.started + timeout - time.monotonic()),
                                       gave_up=exited)
                    break
                except NotServing as error:
                    if attempt < 2 and self._lost_a_port():
                        for name in self._chosen:
                            setattr(self, name, free_port(self.host))
                        self._start()
                        continue
                    raise NotServing(f"{error}; its log ends:\n{self.log_tail()}", error.status) from None
        self.served = True

    def channel(self, credentials: grpc.ChannelCredentials | None = None) -> grpc.Channel:
        return (grpc.secure_channel(self.target, credentials, CHANNEL_OPTIONS) if credentials
                else grpc.insecure_channel(self.target, CHANNEL_OPTIONS))

    def stub(self, channel: grpc.Channel) -> encoder_pb2_grpc.EncoderStub:
        return encoder_pb2_grpc.EncoderStub(channel)

    def health(self) -> int:
        with self.channel() as channel:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, keyed like 'name{label="v"}' (labels sorted)."""
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return samples

    def terminate(self, timeout: float = 60) -> int | None:
        """SIGTERM, then the exit code once it has drained; None if it had to be killed after timeout."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None
        finally:
            if self.log_path:  # the file stays for log_tail() and the test to read; a temporary one lives on
                self._log.close()

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the server wrote (stdout and stderr)."""
        if self.log_path is not None and self._log.closed:  # only a named log is closed (terminate)
            text = Path(self.log_path).read_text(errors="replace")
        else:  # pread: the server shares this file's offset, and moving it (seek) would misplace its next writes
            text = os.pread(self._log.fileno(), os.fstat(self._log.fileno()).st_size, 0).decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:]) or "(nothing)"
