"""The client commands, `attnserve embed` and `attnserve attention`, and serve's start-up errors, as users run them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import numpy as np

from tests.conftest import assert_one_line_error, run_cli
from tests.serving import free_port


def test_embed_prints_json_equal_to_the_engine(server, engine):
    texts = ["A first text.", "Ünïcödé and emoji 🙂 in a second."]
    result = run_cli("embed", *texts, "--target", server.target)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)["embeddings"]
    assert [o["text"] for o in out] == texts
    np.testing.assert_allclose(np.array([o["embedding"] for o in out]), engine.encode(texts).embeddings, atol=1e-6)
    assert [o["num_tokens"] for o in out] == engine.encode(texts).num_tokens.tolist()


def test_embed_reads_stdin_and_passes_options(server, engine):
    result = subprocess.run([sys.executable, "-m", "attnserve.cli", "embed", "-", "--target", server.target,
                             "--no-normalize", "--token-embeddings"],
                            input="one line\nanother line\n", capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)["embeddings"]
    assert [o["text"] for o in out] == ["one line", "another line"]
    assert out[0]["tokens"] == ["[CLS]", "one", "line", "[SEP]"]
    assert np.array(out[0]["token_embeddings"]).shape == (4, 384)
    assert abs(np.linalg.norm(out[0]["embedding"]) - 1.0) > 1e-3  # not normalised


def test_attention_draws_a_labelled_heatmap(server, tmp_path):
    for flags, label in ((["--layer", "2", "--head", "3"], "layer 2, head 3"),
                         ([], "layer 5, mean of 12 heads")):
        out = tmp_path / f"map{len(flags)}.png"
        result = run_cli("attention", "The cat sat on the mat.", *flags, "-o", out, "--target", server.target)
        assert result.returncode == 0, result.stderr
        assert f"{label}, 9 tokens" in result.stdout
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_attention_over_scripts_the_font_lacks_writes_no_warning(server, tmp_path):
    """The CLI turns off no warning but matplotlib's, one per glyph its font lacks (client/plot.py)."""
    result = run_cli("attention", "東京は日本の首都です。🙂", "-o", tmp_path / "cjk.png", "--target", server.target)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_client_errors_are_one_line(server, tmp_path):
    assert_one_line_error(run_cli("embed", "", "--target", server.target), "INVALID_ARGUMENT", "input 0: empty text")
    assert_one_line_error(run_cli("attention", "x", "--layer", "-7", "-o", tmp_path / "m.png", "--target",
                                  server.target), "--layer -7 is out of range: this model has 6 layers, 0..5 or -6..-1")
    assert_one_line_error(run_cli("attention", "x", "--layer", "6", "-o", tmp_path / "m.png", "--target",
                                  server.target), "--layer 6 is out of range: this model has 6 layers, 0..5 or -6..-1")
    assert_one_line_error(run_cli("attention", "x", "--head", "12", "-o", tmp_path / "m.png", "--target",
                                  server.target),
                          "--head 12 is out of range: this model has 12 heads, 0..11 or -12..-1")
    assert_one_line_error(run_cli("attention", "x", "-o", tmp_path / "missing" / "m.png", "--target",
                                  server.target), "cannot write")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    assert_one_line_error(run_cli("embed", "x", "--target", f"127.0.0.1:{closed_port}", "--timeout", "5"),
                          f"no attnserve server at 127.0.0.1:{closed_port}")
    assert_one_line_error(run_cli("embed", "x", "--timeout", "0"), "timeout must be positive")


def test_serve_start_up_errors_are_one_line(artifacts, server, tmp_path):
    busy = server.target.split(":")[1]
    assert_one_line_error(run_cli("serve", "--artifacts", artifacts, "--port", busy, "--metrics-port", "-1"),
                          f"cannot listen on 0.0.0.0:{busy}")
    assert_one_line_error(run_cli("serve", "--artifacts", artifacts, "--port", "0", "--metrics-port",
                                  str(server.metrics_port), "--http-port", "0", "--host", "127.0.0.1"),
                          f"cannot listen on 127.0.0.1:{server.metrics_port} (metrics, --metrics-port)")
    assert_one_line_error(run_cli("serve", "--artifacts", artifacts, "--port", "0", "--metrics-port", "-1",
                                  "--http-port", str(server.http_port), "--host", "127.0.0.1"),
                          f"cannot listen on 127.0.0.1:{server.http_port}")
    assert_one_line_error(run_cli("serve", "--artifacts", artifacts, "--port", "9999", "--http-port", "9999"),
                          "port, http_port and metrics_port must differ")
    assert_one_line_error(run_cli("serve", "--artifacts", tmp_path / "nothing-here"), "nothing-here")
    assert_one_line_error(run_cli("serve", "--artifacts", artifacts, "--max-queue-tokens", "100", "--port", "0",
                                  "--metrics-port", "-1"), "max_queue_tokens 100 cannot hold one input")
    assert_one_line_error(run_cli("serve", "--artifacts", artifacts, "--max-wait-ms", "soon"),
                          "--max-wait-ms: 'soon' is not a valid float")


def test_port_in_use_names_every_port_taken_in_one_line_before_the_model_loads(server, tmp_path):
    """Every taken port at once, each with its flag; with an empty cache and no --artifacts, loading the model
    would export it first: the cache stays empty."""
    cache = tmp_path / "cache"
    free = str(free_port())
    for flags, named in (
        (["--port", server.port, "--http-port", server.http_port, "--metrics-port", server.metrics_port],
         f"127.0.0.1:{server.port} (gRPC, --port) and 127.0.0.1:{server.http_port} (HTTP, --http-port) and "
         f"127.0.0.1:{server.metrics_port} (metrics, --metrics-port): Address already in use"),
        (["--port", free, "--http-port", server.http_port, "--metrics-port", server.metrics_port],
         f"cannot listen on 127.0.0.1:{server.http_port} (HTTP, --http-port) and 127.0.0.1:{server.metrics_port} "
         "(metrics, --metrics-port): Address already in use"),
    ):
        result = run_cli("serve", "--host", "127.0.0.1", *map(str, flags), env={"ATTNSERVE_CACHE": str(cache)})
        assert_one_line_error(result, named)
        assert f"{free} (gRPC" not in result.stderr
        assert not cache.exists() or not any(cache.iterdir()), "the model was loaded (exported) before the check"


def test_serve_without_artifacts_serves_the_default_model_from_the_cache(artifacts, tmp_path, monkeypatch):
    from attnserve.default_model import DEFAULT_MODEL_NAME, artifacts_dir_for
    from tests.serving import ServerProcess

    monkeypatch.setenv("ATTNSERVE_CACHE", str(tmp_path / "cache"))
    cached = artifacts_dir_for(DEFAULT_MODEL_NAME)
    cached.parent.mkdir(parents=True)
    cached.symlink_to(artifacts)  # as if an earlier run had built it there
    server = ServerProcess(None, log_path=tmp_path / "server.log")
    try:
        server.wait_serving()
        assert f'"address": "127.0.0.1:{server.port}"' in server.log_tail()
    finally:
        assert server.terminate() == 0, server.log_tail()
