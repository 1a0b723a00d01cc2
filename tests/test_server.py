"""A real `attnserve serve` process over loopback: its gRPC answers, its log, TLS, and the command line as users run
it (the client commands, serve's start-up errors, and the CLI's manners of issue 45)."""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import pty
import select
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnserve.cli import build_parser, main
from attnserve.client import Client, RequestError, error_details
from attnserve.client.client import make_request, to_array, to_result
from attnserve.config import ClientConfig
from attnserve.engine.pooling import l2_normalize
from attnserve.server_process import CLI
from attnserve.v1 import encoder_pb2 as pb
from tests.conftest import VARIED_TEXTS, assert_one_line_error, run_cli
from tests.serving import ServerProcess, free_port, serving

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
REPOSITORY = Path(__file__).resolve().parents[1]
SERVING = health_pb2.HealthCheckResponse.SERVING


def embed(stub, inputs, **options) -> list:
    return [to_result(e) for e in stub.Embed(make_request(inputs, **options), timeout=60).embeddings]


def test_serving_after_warm_up_and_model_info(server, stub):
    assert server.health() == SERVING
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert (info.model, info.hidden_size, info.num_layers, info.num_heads) == (MODEL, 384, 6, 12)
    assert (info.max_seq_length, info.vocab_size, info.pooling, info.normalize) == (256, 30522, "mean", True)
    assert (info.provider, info.precision) == ("CPUExecutionProvider", "fp32")
    assert info.limits.max_inputs_per_request == 2048 and info.limits.max_batch_tokens == 2048
    assert info.limits.max_queue_tokens == 65536 and info.limits.max_request_bytes == 4 * 2**20


def test_embeddings_equal_the_offline_engine(stub, engine):
    offline = engine.encode(VARIED_TEXTS)
    results = embed(stub, VARIED_TEXTS, truncate=True)
    served = np.stack([r.sentence_embedding for r in results])
    assert served.shape == (len(VARIED_TEXTS), 384) and served.dtype == np.float32
    np.testing.assert_allclose(served, offline.embeddings, atol=2e-6)
    assert [r.num_tokens for r in results] == offline.num_tokens.tolist()
    assert [r.truncated for r in results] == offline.truncated.tolist() and any(offline.truncated)


def test_pooling_normalize_token_embeddings_and_token_ids(stub, engine):
    text = "Pooling is chosen per request."
    [default] = embed(stub, [text], normalize=False, token_embeddings=True)
    [cls] = embed(stub, [text], normalize=False, pooling="cls")
    [mean_normalized] = embed(stub, [text], pooling="mean", normalize=True)
    tokens = default.token_embeddings
    assert tokens.shape == (default.num_tokens, 384) and default.tokens[0] == "[CLS]" and default.tokens[-1] == "[SEP]"
    np.testing.assert_allclose(default.sentence_embedding, tokens.mean(axis=0), atol=1e-5)  # MiniLM pools by mean
    np.testing.assert_allclose(cls.sentence_embedding, tokens[0], atol=1e-5)
    np.testing.assert_allclose(mean_normalized.sentence_embedding, l2_normalize(tokens.mean(axis=0)), atol=1e-5)
    assert cls.tokens == []  # word pieces come with token embeddings or attention only
    # Token ids and text reach the same embedding.
    by_text, by_ids = embed(stub, [text, engine.tokenizer.encode_texts([text])[0].ids.tolist()])
    np.testing.assert_allclose(by_text.sentence_embedding, by_ids.sentence_embedding, atol=1e-6)


def test_attention_shape_rows_and_layers(stub, engine):
    texts = ["The cat sat on the mat.", "A second, longer input: attention maps are cut to each input's tokens."]
    results = embed(stub, texts, attention_layers=[0, -1, 2])
    for r in results:
        assert r.attentions.shape == (3, 12, r.num_tokens, r.num_tokens) and len(r.tokens) == r.num_tokens
        np.testing.assert_allclose(r.attentions.sum(axis=-1), 1.0, atol=1e-5)
    # The same weights as the PyTorch-verified attention graph, layer by layer: -1 is the last layer.
    reference = engine.run(engine.tokenizer.encode_texts(texts[:1]), attention=True).attentions[:, 0]  # L, nh, T, T
    np.testing.assert_allclose(results[0].attentions, reference[[0, 5, 2]], atol=1e-5)
    [default] = embed(stub, texts[:1], attention_layers=[])
    np.testing.assert_allclose(default.attentions, reference[[5]], atol=1e-5)  # empty: the last layer
    [averaged] = embed(stub, texts[:1], attention_layers=[-6, 1], average_heads=True)
    assert averaged.attentions.shape == (2, 1, default.num_tokens, default.num_tokens)
    np.testing.assert_allclose(averaged.attentions[:, 0], reference[[0, 1]].mean(axis=1), atol=1e-5)
    np.testing.assert_allclose(averaged.attentions.sum(axis=-1), 1.0, atol=1e-5)


def test_attention_and_plain_inputs_in_flight_together(stub, engine):
    """Requests for the two graphs interleave; each gets its own kind of answer."""
    texts = [f"Request number {i} of a mixed burst." for i in range(16)]
    futures = [stub.Embed.future(make_request([t], attention_layers=[-1] if i % 2 else None), timeout=60)
               for i, t in enumerate(texts)]
    for i, future in enumerate(futures):
        [r] = [to_result(e) for e in future.result().embeddings]
        assert (r.attentions is not None) == bool(i % 2)
        np.testing.assert_allclose(r.sentence_embedding, engine.encode([texts[i]]).embeddings[0], atol=2e-6)


def test_embed_stream_answers_in_order_and_an_error_names_its_request(stub, engine):
    batches = [[f"stream item {i}", "x " * (5 + 40 * (i % 4))] for i in range(30)]  # lengths vary: order is tested
    replies = list(stub.EmbedStream((make_request(b, truncate=True) for b in batches), timeout=60))
    assert len(replies) == len(batches)
    for batch, reply in zip(batches, replies, strict=True):
        got = np.stack([to_array(e.sentence_embedding) for e in reply.embeddings])
        np.testing.assert_allclose(got, engine.encode(batch).embeddings, atol=2e-6)
    replies = []
    with pytest.raises(grpc.RpcError) as error:
        for reply in stub.EmbedStream(iter([make_request(["fine"]), make_request(["also"]), make_request([""])]),
                                      timeout=30):
            replies.append(reply)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request 2: input 0: empty text" in error.value.details() and len(replies) == 2


def test_reflection_and_health_answer_every_service(server):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with server.channel() as channel:
        [reply] = list(reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10))
        health = health_pb2_grpc.HealthStub(channel)
        statuses = health.List(health_pb2.HealthListRequest(), timeout=10).statuses
        for service in ("nope", "attnserve.v1.Encoder/no-such-model"):
            with pytest.raises(grpc.RpcError) as error:
                health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            details = error_details(error.value)
            assert details.code == grpc.StatusCode.NOT_FOUND and details.reason == "NOT_FOUND", details
            assert repr(service) in details.message and "'attnserve.v1.Encoder'" in details.message, details.message
        known = health.Check(health_pb2.HealthCheckRequest(service="attnserve.v1.Encoder"), timeout=10)
    assert known.status == SERVING
    names = {s.name for s in reply.list_services_response.service}
    assert {"attnserve.v1.Encoder", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names
    # each model's own service name too, as several models are served (server/models.py)
    assert {name: s.status for name, s in statuses.items()} == {
        "": SERVING, "attnserve.v1.Encoder": SERVING, f"attnserve.v1.Encoder/{MODEL}": SERVING}


# --- the log ------------------------------------------------------------------------------------------------------


def test_not_on_a_terminal_every_line_is_json_and_the_start_up_event_names_every_door(server):
    events = [json.loads(line) for line in server.log_tail(10_000).splitlines() if line.strip()]  # every line
    serving = next(e for e in events if e.get("event") == "serving")
    addresses = {"gRPC": f"127.0.0.1:{server.port}", "HTTP": f"http://127.0.0.1:{server.http_port}",
                 "explorer": f"http://127.0.0.1:{server.http_port}/explorer",
                 "metrics": f"http://127.0.0.1:{server.metrics_port}/metrics"}
    assert serving["addresses"] == addresses
    assert serving["message"] == f"serving {serving['model']} on " + ", ".join(f"{k} {v}" for k, v in addresses.items())
    assert serving["address"] == f"127.0.0.1:{server.port}" and serving["http_port"] == server.http_port


def test_log_format_text_gives_readable_lines_and_serve_alone_serves_the_default_model_from_the_cache(
        artifacts, tmp_path, monkeypatch):
    from attnserve.default_model import DEFAULT_MODEL_NAME, artifacts_dir_for

    monkeypatch.setenv("ATTNSERVE_CACHE", str(tmp_path / "cache"))
    cached = artifacts_dir_for(DEFAULT_MODEL_NAME)
    cached.parent.mkdir(parents=True)
    cached.symlink_to(artifacts)  # as if an earlier run had built it there
    server = ServerProcess(None, "--log-format", "text", "--metrics-port", "-1", log_path=tmp_path / "server.log")
    try:
        server.wait_serving()
    finally:
        assert server.terminate() == 0, server.log_tail()
    lines = [line for line in server.log_tail(10_000).splitlines() if line.strip()]
    assert not any(line.startswith("{") for line in lines), lines
    line = next(line for line in lines if " serving " in line)
    assert f"INFO attnserve.server: serving {MODEL} on gRPC 127.0.0.1:{server.port}, HTTP http://127.0.0.1:" \
           f"{server.http_port}, explorer http://127.0.0.1:{server.http_port}/explorer " in line, line  # no metrics
    assert "graphs=" not in line and "event=" not in line and f"http_port={server.http_port}" in line
    assert f"address=127.0.0.1:{server.port}" in line
    assert any(" INFO attnserve.server: stopped" in line for line in lines), lines


def test_on_a_terminal_the_lines_are_text_by_default(artifacts):
    """stderr a terminal (a pseudo-terminal here), no --log-format: text, as a person at a terminal reads."""
    port = free_port()
    controller, terminal = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "ATTNSERVE_LOG_FORMAT"}
    process = subprocess.Popen([*CLI, "serve", "--artifacts", str(artifacts), "--host", "127.0.0.1", "--port",
                                str(port), "--http-port", str(free_port()), "--metrics-port", "-1"],
                               stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, env=env)
    os.close(terminal)
    seen, end = b"", time.monotonic() + 180
    try:
        while b"stopped" not in seen and time.monotonic() < end:
            if b" serving " in seen and process.poll() is None:
                process.send_signal(signal.SIGTERM)
            if select.select([controller], [], [], 1.0)[0]:
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
    assert f"INFO attnserve.server: serving {MODEL} on gRPC 127.0.0.1:{port}" in text, text
    assert '"event"' not in text and process.returncode == 0, text


# --- TLS and mutual TLS, turned on by flags, with certificates made for the test by a throwaway CA ---------------


def issue(directory: Path, name: str, subject: str, issuer: tuple | None = None, *, ca: bool = False,
          server: bool = False):
    """A key and certificate for `subject`, signed by issuer (its key and certificate; None: self-signed), written
    as NAME.key and NAME.pem; returns the key, the certificate and both paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject_name)
               .issuer_name(issuer[1].subject if issuer else subject_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    if not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    cert = builder.sign(issuer[0] if issuer else key, hashes.SHA256())
    (directory / f"{name}.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (directory / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, str(directory / f"{name}.key"), str(directory / f"{name}.pem")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("pki")
    ca_key, ca_cert, _, ca = issue(directory, "ca", "attnserve test CA", ca=True)
    _, _, server_key, server_cert = issue(directory, "server", "localhost", (ca_key, ca_cert), server=True)
    _, _, client_key, client_cert = issue(directory, "client", "a client", (ca_key, ca_cert))
    return dict(ca=ca, server_key=server_key, server_cert=server_cert, client_key=client_key, client_cert=client_cert)


def ssl_context(ca: str, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca)
    if cert:
        context.load_cert_chain(cert, key)
    return context


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual-tls"])
def test_tls_works_and_a_client_without_it_is_refused(artifacts, tmp_path, pki, mutual):
    """Over gRPC and HTTP from the same files: TLS refuses a plaintext client; mutual TLS one without a client
    certificate from the client CA."""
    ca = Path(pki["ca"]).read_bytes()
    client_cert = dict(tls_cert=pki["client_cert"], tls_key=pki["client_key"]) if mutual else {}
    server = ServerProcess(artifacts, "--tls-cert", pki["server_cert"], "--tls-key", pki["server_key"],
                           "--metrics-port", "-1", *(["--tls-client-ca", pki["ca"]] if mutual else []),
                           log_path=tmp_path / "server.log")
    try:
        server.wait_serving(grpc.ssl_channel_credentials(ca, *(Path(pki[f"client_{p}"]).read_bytes()
                                                              for p in ("key", "cert") if mutual)))
        with Client(config=ClientConfig(target=server.target, tls_ca=pki["ca"], **client_cert)) as client:
            assert client.embed(["over TLS"]).shape == (1, 384)
        with Client(config=ClientConfig(target=server.target, timeout=5, tls_ca=pki["ca"] if mutual else None)) as bad:
            with pytest.raises(RequestError) as error:
                bad.embed(["no client certificate" if mutual else "in the clear"])
        assert error.value.code == grpc.StatusCode.UNAVAILABLE
        https = server.http_url.replace("http://127.0.0.1", "https://localhost")
        verify = ssl_context(pki["ca"], pki["client_cert"], pki["client_key"]) if mutual else ssl_context(pki["ca"])
        assert httpx.post(f"{https}/embed", json={"inputs": "over https"}, verify=verify, timeout=30).status_code == 200
        with pytest.raises(httpx.TransportError):
            if mutual:
                httpx.post(f"{https}/embed", json={"inputs": "no client certificate"}, verify=ssl_context(pki["ca"]),
                           timeout=5)
            else:
                httpx.post(f"{server.http_url}/embed", json={"inputs": "in the clear"}, timeout=5)
        if not mutual:  # KServe v2 on the same port, over the same TLS, from Triton's own client; and the CLI's
            import tritonclient.grpc as triton

            triton_client = triton.InferenceServerClient(server.target, ssl=True, root_certificates=pki["ca"])
            text = triton.InferInput("text", [1], "BYTES")
            text.set_data_from_numpy(np.array([b"over TLS, as Triton's client"], dtype=np.object_))
            assert triton_client.infer(triton_client.get_model_repository_index().models[0].name,
                                       [text]).as_numpy("embedding").shape == (1, 384)
            triton_client.close()
            result = run_cli("embed", "over TLS from the CLI", "--target", server.target, "--tls-ca", pki["ca"])
            assert result.returncode == 0, result.stderr
    finally:
        assert server.terminate() == 0, server.log_tail()


# --- the client commands and serve's start-up errors --------------------------------------------------------------


def test_embed_prints_json_equal_to_the_engine_and_reads_stdin(server, engine):
    texts = ["A first text.", "Ünïcödé and emoji 🙂 in a second."]
    result = run_cli("embed", *texts, "--target", server.target)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)["embeddings"]
    assert [o["text"] for o in out] == texts
    np.testing.assert_allclose(np.array([o["embedding"] for o in out]), engine.encode(texts).embeddings, atol=1e-6)
    assert [o["num_tokens"] for o in out] == engine.encode(texts).num_tokens.tolist()
    result = subprocess.run([*CLI, "embed", "-", "--target", server.target, "--no-normalize", "--token-embeddings"],
                            input="one line\nanother line\n", capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)["embeddings"]
    assert [o["text"] for o in out] == ["one line", "another line"]
    assert out[0]["tokens"] == ["[CLS]", "one", "line", "[SEP]"]
    assert np.array(out[0]["token_embeddings"]).shape == (4, 384)
    assert abs(np.linalg.norm(out[0]["embedding"]) - 1.0) > 1e-3  # not normalised


@pytest.mark.parametrize("text, flags, label", [
    ("The cat sat on the mat.", ["--layer", "2", "--head", "3"], "layer 2, head 3, 9 tokens"),
    ("The cat sat on the mat.", [], "layer 5, mean of 12 heads, 9 tokens"),
    # The CLI turns off no warning but matplotlib's, one per glyph its font lacks (client/plot.py).
    ("東京は日本の首都です。🙂", [], ""),
])
def test_attention_draws_a_labelled_heatmap_and_writes_no_warning(server, tmp_path, text, flags, label):
    out = tmp_path / "map.png"
    result = run_cli("attention", text, *flags, "-o", out, "--target", server.target)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert label in result.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


# argv and what its one line says, both formatted with the server's ports, the artifacts, tmp_path and a closed port.
ONE_LINE_ERRORS = [
    ("embed '' --target {target}", ["INVALID_ARGUMENT", "input 0: empty text"]),
    ("attention x --layer -7 -o {tmp}/m.png --target {target}",
     ["--layer -7 is out of range: this model has 6 layers, 0..5 or -6..-1"]),
    ("attention x --layer 6 -o {tmp}/m.png --target {target}",
     ["--layer 6 is out of range: this model has 6 layers, 0..5 or -6..-1"]),
    ("attention x --head 12 -o {tmp}/m.png --target {target}",
     ["--head 12 is out of range: this model has 12 heads, 0..11 or -12..-1"]),
    ("attention x -o {tmp}/missing/m.png --target {target}", ["cannot write"]),
    ("embed x --target 127.0.0.1:{closed} --timeout 5", ["no attnserve server at 127.0.0.1:{closed}"]),
    ("embed x --timeout 0", ["timeout must be positive"]),
    ("serve --artifacts {artifacts} --port {port} --metrics-port -1", ["cannot listen on 0.0.0.0:{port}"]),
    ("serve --artifacts {artifacts} --port 0 --metrics-port {metrics_port} --http-port 0 --host 127.0.0.1",
     ["cannot listen on 127.0.0.1:{metrics_port} (metrics, --metrics-port)"]),
    ("serve --artifacts {artifacts} --port 0 --metrics-port -1 --http-port {http_port} --host 127.0.0.1",
     ["cannot listen on 127.0.0.1:{http_port}"]),
    ("serve --artifacts {artifacts} --port 9999 --http-port 9999", ["port, http_port and metrics_port must differ"]),
    ("serve --artifacts {tmp}/nothing-here --port 0 --http-port -1 --metrics-port -1", ["nothing-here"]),
    ("serve --artifacts {artifacts} --max-queue-tokens 100 --port 0 --http-port -1 --metrics-port -1",
     ["max_queue_tokens 100 cannot hold one input"]),
    ("serve --artifacts {artifacts} --max-wait-ms soon", ["--max-wait-ms: 'soon' is not a valid float"]),
    ("serve --artifacts {artifacts} --gil-switch-interval-ms 0", ["gil_switch_interval_ms must be above 0"]),
    ("serve --artifacts {artifacts} --max-batch-tokens -5", ["max_batch_tokens must be 0 (the provider's own)"]),
    ("serve --artifacts {artifacts} --port 0 --http-port -1 --metrics-port -1 --tls-cert {server_cert}",
     ["TLS needs both --tls-cert and --tls-key"]),
    ("serve --artifacts {artifacts} --port 0 --http-port -1 --metrics-port -1 --tls-cert {tmp}/missing.pem "
     "--tls-key {server_key}",
     ["TLS file unreadable", "missing.pem"]),
]


@pytest.mark.parametrize("argv, fragments", ONE_LINE_ERRORS)
def test_client_and_serve_errors_are_one_line(server, artifacts, tmp_path, pki, argv, fragments):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    values = dict(target=server.target, port=server.port, http_port=server.http_port, closed=closed,
                  metrics_port=server.metrics_port, artifacts=artifacts, tmp=tmp_path, **pki)
    assert_one_line_error(run_cli(*(a.format(**values) for a in shlex.split(argv))),
                          *(f.format(**values) for f in fragments))


def test_port_in_use_names_every_port_taken_in_one_line_before_the_model_loads(server, tmp_path):
    """With an empty cache and no --artifacts, loading the model would export it first: the cache stays empty."""
    cache, free = tmp_path / "cache", str(free_port())
    taken = f"127.0.0.1:{server.http_port} (HTTP, --http-port) and 127.0.0.1:{server.metrics_port} (metrics, " \
            "--metrics-port): Address already in use"
    for port, named in ((server.port, f"127.0.0.1:{server.port} (gRPC, --port) and {taken}"),
                        (free, f"cannot listen on {taken}")):
        result = run_cli("serve", "--host", "127.0.0.1", "--port", port, "--http-port", server.http_port,
                         "--metrics-port", server.metrics_port, env={"ATTNSERVE_CACHE": str(cache)})
        assert_one_line_error(result, named)
        assert f"{free} (gRPC" not in result.stderr
        assert not cache.exists() or not any(cache.iterdir()), "the model was loaded (exported) before the check"


def test_a_start_that_lost_its_chosen_port_is_made_again_on_fresh_ports(artifacts, server, monkeypatch, tmp_path):
    """free_port() picks a port another process may take before the server binds it (a CI run lost one this way:
    "cannot listen on ...: Address already in use"). ServerProcess starts again on fresh ports; here its first HTTP
    port is one the fixture's server holds."""
    import attnserve.server_process as server_process

    picks = iter([free_port(), free_port(), server.http_port])  # gRPC, metrics, then HTTP: taken
    monkeypatch.setattr(server_process, "free_port", lambda host="127.0.0.1": next(picks, None) or free_port(host))
    again = ServerProcess(artifacts, "--workers", "1", log_path=tmp_path / "server.log")
    with serving(again):
        assert again.http_port != server.http_port
        assert httpx.get(f"{again.http_url}/health", timeout=30).status_code == 200
    assert f"cannot listen on 127.0.0.1:{server.http_port}" in (tmp_path / "server.log").read_text()


# --- the command line's manners: one line with its likely fix, not the whole usage; quiet into `| head` ----------


def commands() -> list[str]:
    return list(next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices)


def test_an_invalid_choice_is_one_line_naming_the_closest_and_the_commands_exist():
    assert {"export", "encode", "serve", "embed", "attention", "loadtest", "health"} <= set(commands())
    result = run_cli("serve", "--long-inputs", "chunks")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "usage:" not in result.stderr, result.stderr
    assert result.stderr.startswith("attnserve serve: error: argument --long-inputs: invalid choice: 'chunks'")
    assert result.stderr.rstrip().endswith("did you mean chunk?"), result.stderr


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


@pytest.mark.parametrize("argv, code", [(["embed", *(f"text number {i}" for i in range(40))], 141),
                                        (["serve", "--help"], None)], ids=["embed", "help"])
def test_output_into_a_reader_gone_exits_quietly(server, argv, code):
    """The writing end of a pipe whose reader is gone, as `| head` leaves it: no BrokenPipeError, no "Exception
    ignored"; embed exits as a tool killed by SIGPIPE (128 + 13)."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run([*CLI, *argv, *(["--target", server.target] if code else [])], stdout=write,
                                stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert result.stderr == "", result.stderr
    assert code is None or result.returncode == code


@pytest.mark.skipif(shutil.which("git") is None or not (REPOSITORY / ".git").exists(),
                    reason="needs git and the repository's clone")
def test_the_venv_the_readme_creates_is_ignored_by_git():
    assert "python -m venv .venv" in (REPOSITORY / "README.md").read_text()
    for path in (".venv/", ".venv/bin/python", ".venv/lib/python3.11/site-packages/numpy/__init__.py"):
        ignored = subprocess.run(["git", "check-ignore", "--quiet", "--no-index", path], cwd=REPOSITORY)
        assert ignored.returncode == 0, f"{path} is not ignored by .gitignore"
