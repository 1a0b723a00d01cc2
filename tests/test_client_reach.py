"""The client commands against a port where no attnserve server is, or where the other protocol is served: a line
that says what is there and what to do, not the transport's words."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.conftest import assert_one_line_error, run_cli
from tests.serving import free_port

COMMANDS = ["embed", "health", "attention", "loadtest", "encode --server"]


def command(name: str, target: str, tmp_path) -> list:
    (tmp_path / "in.txt").write_text("x\n")
    return {"encode --server": ["encode", tmp_path / "in.txt", "-o", tmp_path / "out.parquet", "--server", target],
            "embed": ["embed", "x", "--target", target], "health": ["health", "--target", target],
            "attention": ["attention", "x", "-o", tmp_path / "m.png", "--target", target],
            "loadtest": ["loadtest", "--target", target, "--requests", 1]}[name]


@pytest.mark.parametrize("name", COMMANDS)
def test_no_server_says_so_and_how_to_start_one(name, tmp_path):
    target = f"127.0.0.1:{free_port()}"
    assert_one_line_error(run_cli(*command(name, target, tmp_path)),
                          f"no attnserve server at {target} (start one with `attnserve serve`)")
    assert not (tmp_path / "out.parquet").exists()


def test_loadtest_over_http_names_no_server_and_goes_to_the_http_port_by_default():
    port = free_port()
    assert_one_line_error(run_cli("loadtest", "--protocol", "http", "--target", f"http://127.0.0.1:{port}",
                                  "--requests", 1), f"no attnserve server at 127.0.0.1:{port}")
    result = run_cli("loadtest", "--protocol", "http", "--requests", 1, "--json", "-", env={"ATTNSERVE_TARGET": ""})
    said = result.stdout + result.stderr
    assert "localhost:8080" in said and "50051" not in said, said


@pytest.mark.parametrize("name", COMMANDS)
def test_grpc_against_the_http_port_names_the_grpc_port(server, name, tmp_path):
    target = f"127.0.0.1:{server.http_port}"
    flag = "--server" if name == "encode --server" else "--target"  # the flag that names the server, as typed
    assert_one_line_error(run_cli(*command(name, target, tmp_path)),
                          f"{target} speaks HTTP, not gRPC: the gRPC port is 50051 by default ({flag})")


def test_http_against_the_grpc_port_names_the_http_port(server):
    assert_one_line_error(run_cli("loadtest", "--protocol", "http", "--target", server.target, "--requests", 1),
                          f"{server.target} speaks gRPC, not HTTP: the HTTP port is 8080 by default (--target)")


@pytest.mark.parametrize("payload", [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                                     b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
                                     b"\x00garbage, not a preface\r\n\r\n" * 4])
def test_http1_or_garbage_on_the_grpc_port_writes_no_error_to_the_log(server, payload):
    """curl or an HTTP/1.1 client on the gRPC port: at most a WARNING line in the server's log, never a traceback."""
    before = server.log_tail(10_000).splitlines()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
        conn.sendall(payload)
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass
    time.sleep(0.5)  # grpc core logs (if it does) from its own threads
    new = server.log_tail(10_000).splitlines()[len(before):]
    assert "Traceback" not in "\n".join(new), new
    assert len(new) <= 1 and all(json.loads(line)["level"] == "warning" for line in new), new
