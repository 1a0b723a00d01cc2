"""--auto-truncate (on by default, as TEI's since 1.9): a request that does not say `truncate` has its over-long
inputs cut and marked truncated, on every door, through the clients users run (the grpc stub and attnserve's
client, the openai SDK, tei-client, tritonclient.http, the CLI, `encode --server`). A request's `truncate: false`,
or a server started with --no-auto-truncate, refuses them with an error that names the fix as that door spells it.
"""

from __future__ import annotations

import json

import grpc
import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton
from tei_client import HttpClient
from tritonclient.utils import InferenceServerException

from attnserve.cli import build_parser
from attnserve.client import Client, RequestError, error_details
from attnserve.client.client import make_request
from attnserve.config import LoadTestConfig, ServerConfig, from_args
from attnserve.errors import ConfigError, InputTooLongError
from attnserve.server.embed_requests import prepare
from attnserve.server.grpc.status import status_for
from attnserve.server.http import openai as openai_routes
from attnserve.server.http.errors import KSERVE, OPENAI, TEI, http_error
from attnserve.server.requests import EncodeRequest, RequestLimits
from attnserve.v1 import encoder_pb2 as pb
from tests.conftest import assert_one_line_error, run_cli
from tests.serving import ServerProcess, serving
from tests.test_kserve import text_input

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
LONG = "The beginning of a long text. " + "filler words " * 150 + "and its very different ending!"
HUGE_QUERY = "cats " * 10_000  # past the tiny reranker's max_seq_length 64 in any pair
# The fixes, as each door spells them; the first two words of the message say who refused.
GRPC_FIX = "set truncate: true (field `truncate` of EmbedRequest)"
JSON_FIX = 'set "truncate": true in the body'
OPENAI_FIX = 'set "truncate": true in the body (the openai SDK: extra_body={"truncate": True})'
KSERVE_FIX = 'set "parameters": {"truncate": true} in the request'
BY_SERVER = ("to cut it to max_seq_length instead, {fix}, or start the server with --long-inputs truncate (the "
             "default) or chunk")
BY_REQUEST = ", and the request asked not to truncate; to cut it to max_seq_length instead, {fix}"


@pytest.fixture(scope="module")
def strict(artifacts, reranker_artifacts, tmp_path_factory):
    """A server started with --no-auto-truncate, serving the embedder (the default model) and a reranker."""
    process = ServerProcess(None, "--model", f"minilm={artifacts}", "--model", f"reranker={reranker_artifacts}",
                            "--no-auto-truncate", log_path=tmp_path_factory.mktemp("strict") / "server.log")
    with serving(process):
        yield process


@pytest.fixture(scope="module")
def strict_stub(strict):
    with strict.channel() as channel:
        yield strict.stub(channel)


def openai_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)


def triton_client(server) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(server.http_url.removeprefix("http://"), network_timeout=60)


# --- the rule and its words, in process -------------------------------------------------------------------------

def test_the_rule_is_the_requests_truncate_else_the_servers_default(engine):
    def prepared(truncate, long_inputs):
        limits = RequestLimits(max_inputs=8, max_response_bytes=2**26, long_inputs=long_inputs)
        return prepare(EncodeRequest(["short", LONG], truncate=truncate), engine.tokenizer, engine.manifest,
                       limits, 4)

    for truncate, long_inputs in ((None, "truncate"), (True, "truncate"), (True, "refuse"), (True, "chunk")):
        assert [(len(x), x.truncated) for x in prepared(truncate, long_inputs).inputs] == [(3, False), (256, True)]
    for truncate, long_inputs in ((None, "refuse"), (False, "truncate"), (False, "refuse"), (False, "chunk")):
        with pytest.raises(InputTooLongError) as refused:
            prepared(truncate, long_inputs)
        assert (refused.value.field, refused.value.description) == ("inputs[1].text",
                                                                    "longer than max_seq_length 256 tokens")
        assert refused.value.server_default == (truncate is None)
        assert str(refused.value) == "input 1: longer than max_seq_length 256 tokens"  # no protocol's words


def test_each_door_renders_its_own_fix():
    by_server = InputTooLongError("input 1: too long", field="inputs[1].text", description="too long",
                                  server_default=True)
    by_request = InputTooLongError("input 1: too long", field="inputs[1].text", description="too long")

    def body(error, style, names=None) -> str:
        data = json.loads(http_error(error, style, names).body)["error"]
        return data if isinstance(data, str) else data["message"]

    assert body(by_server, OPENAI, openai_routes.NAMES) == "input 1: too long; " + BY_SERVER.format(fix=OPENAI_FIX)
    assert body(by_request, OPENAI, openai_routes.NAMES) == "input 1: too long" + BY_REQUEST.format(fix=OPENAI_FIX)
    assert body(by_request, OPENAI) == "input 1: too long" + BY_REQUEST.format(fix=JSON_FIX)  # /v1/attention
    assert body(by_server, TEI) == "input 1: too long; " + BY_SERVER.format(fix=JSON_FIX)
    assert body(by_server, KSERVE).startswith("input 1: too long; to cut it to max_seq_length instead, " + KSERVE_FIX)
    status = status_for(by_server)
    assert (status.code, status.details) == (grpc.StatusCode.INVALID_ARGUMENT,
                                             "input 1: too long; " + BY_SERVER.format(fix=GRPC_FIX))
    assert "field `truncate` of RerankRequest" in status_for(by_request, request_type="RerankRequest").details


def test_the_setting_is_a_flag_and_an_environment_variable(monkeypatch):
    serve = build_parser()
    assert from_args(ServerConfig, serve.parse_args(["serve"])).auto_truncate is True
    assert from_args(ServerConfig, serve.parse_args(["serve", "--no-auto-truncate"])).auto_truncate is False
    monkeypatch.setenv("ATTNSERVE_AUTO_TRUNCATE", "false")
    assert from_args(ServerConfig, serve.parse_args(["serve"])).auto_truncate is False
    assert from_args(ServerConfig, serve.parse_args(["serve", "--auto-truncate"])).auto_truncate is True
    # TEI's flag is --long-inputs spelled another way: one rule, however it is said
    assert from_args(ServerConfig, serve.parse_args(["serve"])).long_inputs == "refuse"
    monkeypatch.delenv("ATTNSERVE_AUTO_TRUNCATE")
    for flags, rule in ((["--long-inputs", "chunk"], "chunk"), (["--long-inputs", "refuse"], "refuse"),
                        (["--auto-truncate", "--long-inputs", "chunk"], "chunk"), ([], "truncate")):
        config = from_args(ServerConfig, serve.parse_args(["serve", *flags]))
        assert (config.long_inputs, config.auto_truncate) == (rule, rule != "refuse"), flags
    for flags in (["--no-auto-truncate", "--long-inputs", "chunk"], ["--auto-truncate", "--long-inputs", "refuse"]):
        with pytest.raises(ConfigError, match="disagree: give one of them"):
            from_args(ServerConfig, serve.parse_args(["serve", *flags]))


def test_clients_leave_an_unset_truncate_unset():
    """gRPC's optional field: unset and false differ on the wire (same field number, 6)."""
    assert [f.name for f, _ in make_request([LONG]).ListFields()] == ["inputs"]  # truncate not sent
    assert make_request([LONG], truncate=False).HasField("truncate")
    assert pb.EmbedRequest(truncate=False).SerializeToString() == b"\x30\x00"  # field 6, varint 0: sent
    assert pb.RerankRequest(truncate=False).SerializeToString() == b"\x28\x00"  # field 5
    loadtest = build_parser()
    assert from_args(LoadTestConfig, loadtest.parse_args(["loadtest"])).truncate is None
    assert from_args(LoadTestConfig, loadtest.parse_args(["loadtest", "--no-truncate"])).truncate is False
    assert build_parser().parse_args(["embed", "x"]).truncate is None
    assert build_parser().parse_args(["embed", "x", "--no-truncate"]).truncate is False


# --- a default server: an unset truncate cuts, on every door ------------------------------------------------------

def test_grpc_embed_stream_and_attention_cut_an_unset_truncate(stub, engine):
    reply = stub.Embed(make_request([LONG, "short"]), timeout=30)
    assert [(e.num_tokens, e.truncated) for e in reply.embeddings] == [(256, True), (3, False)]
    [streamed] = stub.EmbedStream(iter([make_request([LONG])]), timeout=30)
    assert (streamed.embeddings[0].num_tokens, streamed.embeddings[0].truncated) == (256, True)
    attention = stub.Embed(make_request([LONG], attention_layers=[-1], average_heads=True), timeout=30)
    assert attention.embeddings[0].truncated and list(attention.embeddings[0].attentions.shape) == [1, 1, 256, 256]
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.limits.auto_truncate


def test_grpc_truncate_false_differs_from_unset(stub):
    with pytest.raises(grpc.RpcError) as refused:
        stub.Embed(make_request(["short", LONG], truncate=False), timeout=30)
    details = error_details(refused.value)
    assert details.code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.message == "input 1: longer than max_seq_length 256 tokens" + BY_REQUEST.format(fix=GRPC_FIX)
    assert (details.field, details.description) == ("inputs[1].text", "longer than max_seq_length 256 tokens")


def test_the_python_client_and_cli_leave_it_to_the_server(server, engine):
    with Client(server.target) as client:
        [result] = client.encode([LONG])
        assert (result.num_tokens, result.truncated) == (256, True)
        np.testing.assert_allclose(client.embed([LONG])[0], engine.encode([LONG]).embeddings[0], atol=1e-5)
        with pytest.raises(RequestError, match="the request asked not to truncate"):
            client.embed([LONG], truncate=False)
    result = run_cli("embed", LONG, "--target", server.target)
    assert result.returncode == 0, result.stderr
    [item] = json.loads(result.stdout)["embeddings"]
    assert (item["num_tokens"], item["truncated"]) == (256, True)
    assert_one_line_error(run_cli("embed", LONG, "--no-truncate", "--target", server.target),
                          "INVALID_ARGUMENT", "the request asked not to truncate")


def test_openai_sdk_gets_long_texts_cut(server, engine):
    with openai_client(server) as client:
        reply = client.embeddings.create(input=LONG, model=MODEL)
        assert reply.usage.prompt_tokens == 256
        np.testing.assert_allclose(reply.data[0].embedding, engine.encode([LONG]).embeddings[0], atol=1e-5)
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(input=LONG, model=MODEL, extra_body={"truncate": False})
    assert refused.value.param == "input[0]" and refused.value.body["message"] == (
        "input 0: longer than max_seq_length 256 tokens" + BY_REQUEST.format(fix=OPENAI_FIX))
    without_v1 = httpx.post(f"{server.http_url}/embeddings", json={"input": [LONG], "model": MODEL}, timeout=60)
    assert without_v1.status_code == 200 and without_v1.json()["usage"]["prompt_tokens"] == 256


def test_tei_routes_cut_when_truncate_is_unset(server, engine):
    """As TEI: `req.truncate.unwrap_or(auto_truncate)`. tei-client always sends its truncate (false unless told),
    so through it an over-long text is refused as TEI refuses it, naming the fix; unset (raw JSON, as LangChain's
    and LlamaIndex's TEI integrations send it) is cut."""
    embed = httpx.post(f"{server.http_url}/embed", json={"inputs": [LONG]}, timeout=60)
    np.testing.assert_allclose(np.array(embed.json(), dtype=np.float32)[0], engine.encode([LONG]).embeddings[0],
                               atol=1e-5)
    embed_all = httpx.post(f"{server.http_url}/embed_all", json={"inputs": [LONG]}, timeout=60)
    assert np.array(embed_all.json()[0]).shape == (256, 384)
    tei = HttpClient(server.http_url, timeout=60)
    assert tei.embed([LONG]) == {"error": "input 0: longer than max_seq_length 256 tokens" + BY_REQUEST.format(
        fix=JSON_FIX), "error_type": "Validation"}
    np.testing.assert_allclose(np.array(tei.embed([LONG], truncate=True), dtype=np.float32)[0],
                               engine.encode([LONG]).embeddings[0], atol=1e-5)
    assert httpx.get(f"{server.http_url}/info", timeout=10).json()["auto_truncate"] is True


def test_attention_route_cuts_and_marks(server):
    reply = httpx.post(f"{server.http_url}/v1/attention", json={"inputs": LONG, "average_heads": True}, timeout=60)
    item = reply.json()["data"][0]
    assert (item["num_tokens"], item["truncated"], item["shape"]) == (256, True, [1, 1, 256, 256])
    refused = httpx.post(f"{server.http_url}/v1/attention", json={"inputs": LONG, "truncate": False}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["message"] == (
        "input 0: longer than max_seq_length 256 tokens" + BY_REQUEST.format(fix=JSON_FIX))


def test_tritonclient_gets_long_texts_cut(server, engine):
    client = triton_client(server)
    try:
        cut = client.infer(MODEL, [text_input([LONG], binary=True)])
        assert cut.as_numpy("num_tokens").tolist() == [256]
        np.testing.assert_allclose(cut.as_numpy("embedding"), engine.encode([LONG]).embeddings, atol=1e-5)
    finally:
        client.close()


# --- a --no-auto-truncate server: an unset truncate refuses, naming the door's fix and the flag --------------------

def test_strict_grpc_refuses_an_unset_truncate_and_takes_true(strict_stub):
    with pytest.raises(grpc.RpcError) as refused:
        strict_stub.Embed(make_request([LONG]), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "input 0: longer than max_seq_length 256 tokens; " + BY_SERVER.format(
        fix=GRPC_FIX)
    cut = strict_stub.Embed(make_request([LONG], truncate=True), timeout=30)
    assert (cut.embeddings[0].num_tokens, cut.embeddings[0].truncated) == (256, True)
    with pytest.raises(grpc.RpcError) as refused:
        strict_stub.Rerank(pb.RerankRequest(query=HUGE_QUERY, texts=["x"], model="reranker"), timeout=30)
    assert refused.value.details().endswith(BY_SERVER.format(fix="set truncate: true (field `truncate` of "
                                                                 "RerankRequest)"))
    assert len(strict_stub.Rerank(pb.RerankRequest(query=HUGE_QUERY, texts=["x"], model="reranker", truncate=True),
                                  timeout=30).results) == 1
    assert not strict_stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).limits.auto_truncate


def test_strict_http_doors_name_their_fix(strict):
    long_error = "input 0: longer than max_seq_length 256 tokens; "
    with openai_client(strict) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(input=LONG, model="minilm")
        assert refused.value.body["message"] == long_error + BY_SERVER.format(fix=OPENAI_FIX)
        assert client.embeddings.create(input=LONG, model="minilm", extra_body={"truncate": True}
                                        ).usage.prompt_tokens == 256
    embed = httpx.post(f"{strict.http_url}/embed", json={"inputs": [LONG]}, timeout=60)
    assert (embed.status_code, embed.json()) == (400, {"error": long_error + BY_SERVER.format(fix=JSON_FIX),
                                                       "error_type": "Validation"})
    assert httpx.get(f"{strict.http_url}/info", timeout=10).json()["auto_truncate"] is False
    attention = httpx.post(f"{strict.http_url}/v1/attention", json={"inputs": LONG}, timeout=60)
    assert attention.json()["error"]["message"] == long_error + BY_SERVER.format(fix=JSON_FIX)
    rerank = httpx.post(f"{strict.http_url}/v1/rerank", json={"query": HUGE_QUERY, "documents": ["x"],
                                                              "model": "reranker"}, timeout=60)
    assert rerank.status_code == 400 and rerank.json()["error"]["message"].endswith(BY_SERVER.format(fix=JSON_FIX))
    client = triton_client(strict)
    try:
        with pytest.raises(InferenceServerException) as refused_kserve:
            client.infer("minilm", [text_input([LONG], binary=True)])
        assert refused_kserve.value.status() == "400"
        assert refused_kserve.value.message().startswith(long_error + "to cut it to max_seq_length instead, "
                                                         + KSERVE_FIX)
        assert client.infer("minilm", [text_input([LONG], binary=True)], parameters={"truncate": True}
                            ).as_numpy("num_tokens").tolist() == [256]
    finally:
        client.close()


def test_strict_client_and_encode_server_follow_the_server(strict, tmp_path):
    with Client(strict.target) as client:
        with pytest.raises(RequestError, match="or start the server with --long-inputs truncate"):
            client.embed([LONG])
        assert client.encode([LONG], truncate=True)[0].truncated
    source = tmp_path / "in.txt"
    source.write_text(f"short\n{LONG}\n")
    assert_one_line_error(run_cli("encode", source, "-o", tmp_path / "out.parquet", "--server", strict.target,
                                  "--no-progress"), "line 2", "longer than max_seq_length 256 tokens")
