"""The server's log: JSON lines for a collector (stderr not a terminal), human-readable lines on a terminal, or
as --log-format says; the start-up line names the address of every door."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import time

from attnserve.server_process import CLI

from .serving import ServerProcess, free_port


def serving_line(lines: list[str]) -> str:
    return next(line for line in lines if " serving " in line or '"event": "serving"' in line)


def test_not_on_a_terminal_every_line_is_json_and_the_start_up_event_names_every_door(server):
    lines = [line for line in server.log_tail(10_000).splitlines() if line.strip()]
    events = [json.loads(line) for line in lines]  # every line parses
    serving = next(e for e in events if e.get("event") == "serving")
    where = (f"gRPC 127.0.0.1:{server.port}, HTTP http://127.0.0.1:{server.http_port}, "
             f"explorer http://127.0.0.1:{server.http_port}/explorer, "
             f"metrics http://127.0.0.1:{server.metrics_port}/metrics")
    assert serving["message"] == f"serving {serving['model']} on {where}"
    assert serving["addresses"] == {"gRPC": f"127.0.0.1:{server.port}",
                                    "HTTP": f"http://127.0.0.1:{server.http_port}",
                                    "explorer": f"http://127.0.0.1:{server.http_port}/explorer",
                                    "metrics": f"http://127.0.0.1:{server.metrics_port}/metrics"}
    assert serving["address"] == f"127.0.0.1:{server.port}" and serving["http_port"] == server.http_port


def test_log_format_text_gives_readable_lines(artifacts, tmp_path):
    server = ServerProcess(artifacts, "--log-format", "text", "--metrics-port", "-1",
                           log_path=tmp_path / "server.log")
    try:
        server.wait_serving()
    finally:
        assert server.terminate() == 0, server.log_tail()
    lines = [line for line in server.log_tail(10_000).splitlines() if line.strip()]
    assert not any(line.startswith("{") for line in lines), lines
    line = serving_line(lines)
    assert f"INFO attnserve.server: serving sentence-transformers/all-MiniLM-L6-v2 on gRPC 127.0.0.1:{server.port}, " \
           f"HTTP http://127.0.0.1:{server.http_port}, explorer http://127.0.0.1:{server.http_port}/explorer " \
           in line, line  # metrics off: not named
    assert "graphs=" not in line and "event=" not in line and f"http_port={server.http_port}" in line
    assert any(" INFO attnserve.server: stopped" in line for line in lines), lines


def test_on_a_terminal_the_lines_are_text_by_default(artifacts):
    """stderr a terminal (a pseudo-terminal here), no --log-format: text, as a person at a terminal reads."""
    port, http_port = free_port(), free_port()
    controller, terminal = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "ATTNSERVE_LOG_FORMAT"}
    process = subprocess.Popen([*CLI, "serve", "--artifacts", str(artifacts), "--host", "127.0.0.1", "--port",
                                str(port), "--http-port", str(http_port), "--metrics-port", "-1"],
                               stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, env=env)
    os.close(terminal)
    seen, end = b"", time.monotonic() + 180
    try:
        while b"stopped" not in seen and time.monotonic() < end:
            if b" serving " in seen and process.poll() is None:
                process.send_signal(signal.SIGTERM)
            ready, _, _ = select.select([controller], [], [], 1.0)
            if ready:
                try:
                    seen += os.read(controller, 65536)
                except OSError:  # the terminal's other side closed: the server exited
                    break
    finally:
        try:
            process.wait(60)  # it said "stopped": it exits now
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        os.close(controller)
    text = seen.decode(errors="replace")
    assert f"INFO attnserve.server: serving sentence-transformers/all-MiniLM-L6-v2 on gRPC 127.0.0.1:{port}" in text, \
        text
    assert '"event"' not in text and process.returncode == 0, text
