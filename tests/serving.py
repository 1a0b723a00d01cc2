"""A real `attnserve serve` process on loopback ports, as a user starts it, for the server tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from attnserve.v1 import encoder_pb2_grpc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, artifacts: Path | None, *flags: str, env: dict | None = None, log_path: Path | None = None,
                 host: str = "127.0.0.1", port: int | None = None, metrics_port: int | None = None,
                 http_port: int | None = None):
        """artifacts None: serve the default model from the cache, as `attnserve serve` alone does.
        port, metrics_port, http_port None: free ones."""
        self.host = host
        self.port, self.metrics_port = port or free_port(), metrics_port or free_port()
        self.http_port = http_port or free_port()
        self.target = f"{'localhost' if host == '127.0.0.1' else host}:{self.port}"
        self.http_url = f"http://{f'[{host}]' if ':' in host else host}:{self.http_port}"
        self.log_path = log_path
        self._log = open(log_path, "w") if log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [sys.executable, "-m", "attnserve.cli", "serve", *(["--artifacts", str(artifacts)] if artifacts else []),
             "--host", host,
             "--port", str(self.port), "--metrics-port", str(self.metrics_port), "--http-port", str(self.http_port),
             *flags],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    def wait_serving(self, credentials: grpc.ChannelCredentials | None = None, timeout: float = 120) -> None:
        """Until the standard health service says SERVING (only after warm-up)."""
        end = time.monotonic() + timeout
        with self.channel(credentials) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < end:
                if self.process.poll() is not None:
                    raise RuntimeError(f"server exited with {self.process.returncode}: {self.log_tail()}")
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                            health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
        raise RuntimeError(f"server not SERVING after {timeout}s: {self.log_tail()}")

    def channel(self, credentials: grpc.ChannelCredentials | None = None) -> grpc.Channel:
        options = [("grpc.max_receive_message_length", -1)]
        return (grpc.secure_channel(self.target, credentials, options) if credentials
                else grpc.insecure_channel(self.target, options))

    def stub(self, channel: grpc.Channel) -> encoder_pb2_grpc.EncoderStub:
        return encoder_pb2_grpc.EncoderStub(channel)

    def health(self) -> int:
        with self.channel() as channel:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, keyed like 'name{label="v"}'."""
        text = urllib.request.urlopen(f"http://{self.host}:{self.metrics_port}/metrics", timeout=5).read().decode()
        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return samples

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
            if self.log_path:
                self._log.close()

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path:
            return "(no log kept)"
        self._log.flush()
        return "\n".join(Path(self.log_path).read_text().splitlines()[-lines:])
