"""Long inputs on all-MiniLM-L6-v2 (max_seq_length 256): --long-inputs chunk against sentence-transformers' own modules;
late chunking against transformers' AutoModel and its tokenizer's offsets, served and offline; and --auto-truncate
(on by default, as TEI's): an unset `truncate` cuts on every door, through the clients users run, while `truncate:
false` or a --no-auto-truncate server refuses, naming the fix as that door spells it."""

from __future__ import annotations

import json

import grpc
import httpx
import numpy as np
import openai
import pyarrow.parquet as pq
import pytest
import torch
import tritonclient.http as triton
from tei_client import HttpClient
from tritonclient.utils import InferenceServerException

from attnserve.cli import build_parser
from attnserve.client import Client, RequestError, error_details
from attnserve.client.client import make_request
from attnserve.config import ClientConfig, LoadTestConfig, ServerConfig, from_args
from attnserve.default_model import default_checkpoint_dir
from attnserve.engine.engine import Engine
from attnserve.errors import ConfigError, InputTooLongError
from attnserve.offline.encode import encode_file
from attnserve.offline.job import EncodeJob
from attnserve.offline.remote import encode_file_remote
from attnserve.offline.rows import LateChunks
from attnserve.server.embed_requests import prepare
from attnserve.server.grpc.status import status_for
from attnserve.server.http import openai as openai_routes
from attnserve.server.http.errors import KSERVE, OPENAI, TEI, http_error
from attnserve.server.requests import EncodeRequest, RequestLimits
from attnserve.v1 import encoder_pb2 as pb
from tests.conftest import assert_one_line_error, run_cli
from tests.offline_helpers import encoded, errors_of, text_file
from tests.output_kinds import grpc_refusal
from tests.serving import ServerProcess, serving
from tests.test_kserve import text_input

MAX = 256  # all-MiniLM-L6-v2's max_seq_length
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
LONG = " ".join(f"Sentence {i} tells of the {i}th river and its towns." for i in range(80))  # ~1,100 tokens
MEDIUM = " ".join(f"word{i} and more text" for i in range(60))  # ~330 tokens: two windows, the second short
DOC = ("The Eiffel Tower stands in Paris. It was finished in 1889! Berlin is the capital of Germany.\n"
       "Its population is about 3.8 million? The city is known for its art scene.")
HUGE_QUERY = "cats " * 10_000  # past the tiny reranker's max_seq_length 64 in any pair
TOO_LONG = f"longer than max_seq_length {MAX} tokens"
# The fixes, as each door spells them; the first two words of the message say who refused.
GRPC_FIX = "set truncate: true (field `truncate` of EmbedRequest)"
JSON_FIX = 'set "truncate": true in the body'
OPENAI_FIX = 'set "truncate": true in the body (the openai SDK: extra_body={"truncate": True})'
KSERVE_FIX = 'set "parameters": {"truncate": true} in the request'
BY_SERVER = ("to cut it to max_seq_length instead, {fix}, or start the server with --long-inputs truncate (the "
             "default) or chunk")
BY_REQUEST = ", and the request asked not to truncate; to cut it to max_seq_length instead, {fix}"


def started(tmp_path_factory, name: str, *args):
    process = ServerProcess(*args, log_path=tmp_path_factory.mktemp(name) / "server.log")
    with serving(process):
        yield process


@pytest.fixture(scope="module")
def chunking(artifacts, tmp_path_factory):
    yield from started(tmp_path_factory, "chunking", artifacts, "--long-inputs", "chunk")


@pytest.fixture(scope="module")
def strict(artifacts, reranker_artifacts, tmp_path_factory):
    """--no-auto-truncate, serving the embedder (the default model) and a reranker."""
    yield from started(tmp_path_factory, "strict", None, "--model", f"minilm={artifacts}", "--model",
                       f"reranker={reranker_artifacts}", "--no-auto-truncate")


@pytest.fixture(scope="module")
def chunking_stub(chunking):
    with chunking.channel() as channel:
        yield chunking.stub(channel)


@pytest.fixture(scope="module")
def st_model():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(default_checkpoint_dir()), device="cpu")


def st_chunked(model, text: str, prompt: str = "") -> np.ndarray:
    """vLLM's chunked processing with sentence-transformers' own modules: the text's tokens in windows of
    max_seq_length (each framed [CLS] prompt window [SEP]), each window through Transformer and Pooling (Normalize
    left out), their embeddings averaged weighted by the text's tokens in each, then normalised."""
    tokenizer = model.tokenizer
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    before = tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else []
    room = model.max_seq_length - 2 - len(before)
    windows = [ids[i:i + room] for i in range(0, len(ids), room)]
    pooled = []
    with torch.no_grad():
        for window in windows:
            input_ids = torch.tensor([[tokenizer.cls_token_id, *before, *window, tokenizer.sep_token_id]])
            features = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
                        "token_type_ids": torch.zeros_like(input_ids)}
            pooled.append(model[1](model[0](features))["sentence_embedding"][0].double())  # (H,)
    weights = torch.tensor([len(w) for w in windows], dtype=torch.float64)
    mean = (weights[:, None] * torch.stack(pooled)).sum(0) / weights.sum()
    return torch.nn.functional.normalize(mean, dim=0).numpy()


def grpc_embeddings(stub, texts, **options):
    reply = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=t) for t in texts], **options), timeout=120)
    return reply, np.stack([np.frombuffer(e.sentence_embedding.data, "<f4") for e in reply.embeddings])


def test_a_long_text_is_embedded_in_windows_as_sentence_transformers_computes_it(chunking, chunking_stub, st_model):
    texts = [LONG, "a short one", MEDIUM]
    reply, vectors = grpc_embeddings(chunking_stub, texts)
    lengths = [len(st_model.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    windows = [-(-n // (MAX - 2)) for n in lengths]  # the windows of 254 tokens each of the text's tokens fill
    assert windows[0] >= 4 and windows[2] == 2
    assert [(e.windows, e.truncated, e.num_tokens) for e in reply.embeddings] == [
        (w if w > 1 else 0, False, n + 2 * w) for w, n in zip(windows, lengths, strict=True)]  # each window framed
    for text, vector in zip(texts, vectors, strict=True):
        expected = st_chunked(st_model, text) if text != "a short one" else st_model.encode(text)
        np.testing.assert_allclose(vector, expected, atol=2e-5)
    _, prompted = grpc_embeddings(chunking_stub, [MEDIUM], prompt="query: ")  # every window has the prompt
    np.testing.assert_allclose(prompted[0], st_chunked(st_model, MEDIUM, "query: "), atol=2e-5)
    # TEI's /embed says which inputs it chunked in a header (its body is the vectors alone)
    answer = httpx.post(f"{chunking.http_url}/embed", json={"inputs": texts}, timeout=120)
    assert answer.status_code == 200 and answer.headers["x-chunked-inputs"] == "0,2"
    assert "x-truncated-inputs" not in answer.headers
    np.testing.assert_allclose(np.asarray(answer.json()), vectors, atol=1e-6)


def test_what_cannot_be_chunked_is_cut_and_marked(chunking, chunking_stub):
    """A request's own truncate wins; token ids, pairs and token-level outputs are cut, as truncate cuts them."""
    reply, _ = grpc_embeddings(chunking_stub, [LONG], truncate=True)
    embedding = reply.embeddings[0]
    assert (embedding.windows, embedding.truncated, embedding.num_tokens) == (0, True, MAX)
    reply, _ = grpc_embeddings(chunking_stub, [LONG], return_token_embeddings=True)
    assert reply.embeddings[0].truncated and reply.embeddings[0].token_embeddings.shape[0] == MAX
    ids = pb.Input(token_ids=pb.TokenIds(ids=[101, *[2000] * 400, 102]))
    reply = chunking_stub.Embed(pb.EmbedRequest(inputs=[ids]), timeout=60)
    assert reply.embeddings[0].truncated and reply.embeddings[0].num_tokens == MAX
    answer = httpx.post(f"{chunking.http_url}/embed", json={"inputs": [LONG, "short"], "truncate": True}, timeout=60)
    assert answer.headers["x-truncated-inputs"] == "0" and "x-chunked-inputs" not in answer.headers
    with pytest.raises(Exception, match="longer than max_seq_length"):
        grpc_embeddings(chunking_stub, [LONG], truncate=False)
    info = chunking_stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert (info.limits.long_inputs, info.limits.auto_truncate) == ("chunk", True)
    assert httpx.get(f"{chunking.http_url}/info", timeout=10).json()["long_inputs"] == "chunk"


def test_openai_cohere_and_kserve_replies_mark_long_inputs_in_a_header(chunking):
    client = openai.OpenAI(base_url=f"{chunking.http_url}/v1", api_key="unused")
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=["short", LONG])
    assert raw.headers["x-chunked-inputs"] == "1" and len(raw.parse().data) == 2
    answer = httpx.post(f"{chunking.http_url}/v2/embed", timeout=60, json={
        "model": "", "texts": [LONG], "input_type": "search_document", "embedding_types": ["float"]})
    # Cohere's truncate is END unless said (its API's default): cut, and marked so
    assert answer.status_code == 200 and answer.headers["x-truncated-inputs"] == "0"
    kserve = triton.InferenceServerClient(chunking.http_url.removeprefix("http://"))  # the header, JSON or binary
    for binary in (False, True):
        result = kserve.infer(MODEL, [text_input(["short", LONG], binary)], outputs=[
            triton.InferRequestedOutput("embedding", binary_data=binary)])
        assert result.get_response()["outputs"][0]["shape"] == [2, 384]
        answer = httpx.post(f"{chunking.http_url}/v2/models/{MODEL}/infer", json={
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["short", LONG]}],
            "outputs": [{"name": "embedding", "parameters": {"binary_data": binary}}]}, timeout=60)
        assert answer.status_code == 200 and answer.headers["x-chunked-inputs"] == "1"
        assert answer.headers["content-type"] == ("application/octet-stream" if binary else "application/json")


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModel, AutoTokenizer

    directory = str(default_checkpoint_dir())
    return AutoTokenizer.from_pretrained(directory), AutoModel.from_pretrained(directory).eval()


def hf_late_chunks(hf, text: str, spans: list[tuple[int, int]]) -> np.ndarray:
    """The reference: the text's token embeddings from transformers (in windows of max_seq_length tokens, each
    framed by [CLS] and [SEP], put end to end), then each span's tokens (those that start in it) mean-pooled and
    normalised."""
    tokenizer, model = hf
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, starts = encoding["input_ids"], np.array([start for start, _ in encoding["offset_mapping"]])
    tokens = []
    with torch.no_grad():
        for i in range(0, len(ids), MAX - 2):
            window = torch.tensor([[tokenizer.cls_token_id, *ids[i:i + MAX - 2], tokenizer.sep_token_id]])
            hidden = model(input_ids=window, attention_mask=torch.ones_like(window)).last_hidden_state[0]
            tokens.append(hidden[1:-1])  # the text's tokens alone
    hidden = torch.cat(tokens).double().numpy()  # (n, H)
    means = [hidden[(starts >= start) & (starts < stop)].mean(axis=0) for start, stop in spans]
    return np.stack([mean / np.linalg.norm(mean) for mean in means])


def late(spans) -> pb.LateChunking:
    return pb.LateChunking(spans=[pb.Spans(spans=[pb.Span(start=a, stop=b) for a, b in spans])])


def chunk_vectors(embedding) -> tuple[list[tuple[int, int]], np.ndarray]:
    return ([(c.start, c.stop) for c in embedding.chunks],
            np.stack([np.frombuffer(c.embedding.data, "<f4") for c in embedding.chunks]))


def test_late_chunks_over_grpc_are_transformers_token_embeddings_pooled_per_span(stub, hf):
    spans = [(0, 33), (34, 60), (0, 60), (61, 96)]
    embedding = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=DOC)], late_chunking=late(spans)),
                           timeout=60).embeddings[0]
    got_spans, vectors = chunk_vectors(embedding)
    assert got_spans == spans and embedding.windows == 0  # whole: left off the wire
    np.testing.assert_allclose(vectors, hf_late_chunks(hf, DOC, spans), atol=2e-5)
    # the chunks carry the document's context: not what each span embeds to alone
    alone = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=DOC[34:60])]), timeout=60).embeddings[0]
    assert not np.allclose(vectors[1], np.frombuffer(alone.sentence_embedding.data, "<f4"), atol=1e-3)


def test_the_built_in_chunkers_cut_sentences_and_token_runs(server, stub, hf):
    reply = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=DOC)], late_chunking=pb.LateChunking(
        chunker="sentences")), timeout=60)
    spans, vectors = chunk_vectors(reply.embeddings[0])
    assert [DOC[a:b] for a, b in spans] == ["The Eiffel Tower stands in Paris.", "It was finished in 1889!",
                                            "Berlin is the capital of Germany.", "Its population is about 3.8 million?",
                                            "The city is known for its art scene."]
    np.testing.assert_allclose(vectors, hf_late_chunks(hf, DOC, spans), atol=2e-5)
    answer = httpx.post(f"{server.http_url}/embed_chunks", timeout=60,
                        json={"inputs": [DOC, LONG], "chunker": "tokens", "chunk_tokens": 100})
    assert answer.status_code == 200, answer.text
    doc, long = answer.json()
    assert [c["num_tokens"] for c in doc["chunks"]] == [len(hf[0](DOC, add_special_tokens=False)["input_ids"])]
    counts = [c["num_tokens"] for c in long["chunks"]]
    assert long["windows"] >= 4 and set(counts[:-1]) == {100} and 0 < counts[-1] <= 100
    spans = [(c["start"], c["stop"]) for c in long["chunks"]]
    np.testing.assert_allclose([c["embedding"] for c in long["chunks"]], hf_late_chunks(hf, LONG, spans),
                               atol=2e-5)  # across windows: the 254-token windows do not follow the 100-token runs


def test_late_chunking_over_http_matches_grpc_and_cuts_dimensions(server, stub):
    spans = [[0, 33], [34, 60]]
    answer = httpx.post(f"{server.http_url}/embed_chunks", timeout=60,
                        json={"inputs": DOC, "spans": [spans], "dimensions": 64, "encoding_format": "float"})
    assert answer.status_code == 200, answer.text
    [item] = answer.json()
    reply = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=DOC)], late_chunking=late(spans), dimensions=64),
                       timeout=60)
    _, vectors = chunk_vectors(reply.embeddings[0])
    assert [[c["start"], c["stop"]] for c in item["chunks"]] == spans
    np.testing.assert_allclose([c["embedding"] for c in item["chunks"]], vectors, atol=1e-6)
    assert vectors.shape == (2, 64) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    whole = np.frombuffer(reply.embeddings[0].sentence_embedding.data, "<f4")
    np.testing.assert_allclose(item["embedding"], whole, atol=1e-6)  # the document's own embedding beside them


@pytest.mark.parametrize("body, message", [
    ({"inputs": DOC, "spans": [[[0, 999]]]}, "input 0: chunk 0 [0, 999) is not a span of the text's"),
    ({"inputs": DOC, "spans": [[[3, 4]]]}, "input 0: no token starts in chunk 0 [3, 4)"),
    ({"inputs": DOC, "spans": [[[5, 5]]]}, "input 0: chunk 0 [5, 5) is not a span"),
    ({"inputs": [DOC, DOC], "spans": [[[0, 5]]]}, "give one list of spans per input (2)"),
    ({"inputs": DOC}, "late chunking takes the chunks' spans or a chunker"),
    ({"inputs": DOC, "chunker": "sentences", "chunk_tokens": 5}, "chunk_tokens goes with the tokens chunker"),
    ({"inputs": DOC, "chunker": "sentences", "prompt": "a", "prompt_name": "b"}, "not both"),
])
def test_a_bad_late_chunking_request_gets_a_clear_error(server, body, message):
    answer = httpx.post(f"{server.http_url}/embed_chunks", json=body, timeout=60)
    assert answer.status_code in (400, 422) and message in answer.json()["error"], answer.text


@pytest.mark.parametrize("fields, message", [
    ({"inputs": [pb.Input(token_ids=pb.TokenIds(ids=[101, 102]))]}, "late chunking reads texts"),
    ({"pooling": pb.CLS}, "pooling does not apply to late chunking"),
    ({"truncate": True}, "truncate does not apply to late chunking"),
    ({"late_chunking": pb.LateChunking(chunker="words")}, "chunker 'words' is not one of sentences, tokens"),
])
def test_late_chunking_refuses_what_it_cannot_pool(stub, fields, message):
    request = {"inputs": [pb.Input(text=DOC)], "late_chunking": pb.LateChunking(chunker="sentences"), **fields}
    assert message in grpc_refusal(stub.Embed, pb.EmbedRequest(**request), timeout=60)


def test_an_offline_run_writes_a_row_per_chunk_as_transformers_computes_them(artifacts, hf, server, tmp_path):
    """Locally and through a server (tests/test_encode_drivers.py on Ray)."""
    rows = [{"id": "doc", "text": DOC}, {"id": "long", "text": LONG}, {"id": "ids", "token_ids": [101, 2023, 102]},
            {"id": "nothing", "text": "\u0000\u0001"}, {"id": "last", "text": "One more. And the end!"}]
    src = text_file(tmp_path / "docs.jsonl", map(json.dumps, rows))
    local, remote = tmp_path / "l.parquet", tmp_path / "r.parquet"
    job = dict(progress=False, on_error="skip", late_chunking=LateChunks("sentences"))
    stats = encode_file(Engine.from_directory(artifacts), EncodeJob(src, local, **job))
    assert stats.texts == 3 and stats.skipped == 2
    table = pq.read_table(local)
    assert table.column_names == ["id", "chunk", "start", "stop", "embedding", "num_tokens"]
    rows = table.drop(["embedding"]).to_pylist()
    assert [r["id"] for r in rows if r["chunk"] == 0] == ["doc", "long", "last"]  # the input's order
    for name, text in {"doc": DOC, "long": LONG, "last": "One more. And the end!"}.items():
        mine = [(r, v) for r, v in zip(rows, table.column("embedding").to_pylist(), strict=True) if r["id"] == name]
        assert [r["chunk"] for r, _ in mine] == list(range(len(mine)))
        spans = [(r["start"], r["stop"]) for r, _ in mine]
        np.testing.assert_allclose(np.stack([v for _, v in mine]), hf_late_chunks(hf, text, spans), atol=2e-5)
    assert len([r for r in rows if r["id"] == "long"]) == 80  # a sentence each, across its windows
    assert [e["reason"] for e in errors_of(tmp_path / "l.errors.jsonl")] == [
        "late chunking reads texts: this input is token ids",
        "no token to chunk: the tokenizer keeps nothing of the text"]
    encode_file_remote(EncodeJob(src, remote, **job), ClientConfig(target=server.target))
    got = pq.read_table(remote)
    assert got.drop(["embedding"]).equals(table.drop(["embedding"]))
    np.testing.assert_allclose(np.stack(got.column("embedding").to_pylist()),
                               np.stack(table.column("embedding").to_pylist()), atol=1e-6)
    assert (tmp_path / "r.errors.jsonl").read_text() == (tmp_path / "l.errors.jsonl").read_text()


def test_the_encode_command_takes_late_chunking_flags(artifacts, tmp_path):
    """Its refusals: tests/test_encode.py."""
    src, out = text_file(tmp_path / "docs.txt", [DOC, "Second line. Two sentences."]), tmp_path / "out.parquet"
    encoded(src, out, "--artifacts", artifacts, "--late-chunking", "tokens", "--chunk-tokens", "5", "--dimensions",
            "32")
    table = pq.read_table(out)
    assert set(table.column("num_tokens").to_pylist()) <= set(range(1, 6))
    assert table.schema.field("embedding").type.list_size == 32


def test_the_rule_is_the_requests_truncate_else_the_servers_default(engine):
    def prepared(truncate, long_inputs):
        limits = RequestLimits(max_inputs=8, max_response_bytes=2**26, long_inputs=long_inputs)
        return prepare(EncodeRequest(["short", LONG], truncate=truncate), engine.tokenizer, engine.manifest,
                       limits, 4)

    for truncate, long_inputs in ((None, "truncate"), (True, "truncate"), (True, "refuse"), (True, "chunk")):
        assert [(len(x), x.truncated) for x in prepared(truncate, long_inputs).inputs] == [(3, False), (MAX, True)]
    for truncate, long_inputs in ((None, "refuse"), (False, "truncate"), (False, "refuse"), (False, "chunk")):
        with pytest.raises(InputTooLongError) as refused:
            prepared(truncate, long_inputs)
        assert (refused.value.field, refused.value.description) == ("inputs[1].text", TOO_LONG)
        assert refused.value.server_default == (truncate is None)
        assert str(refused.value) == f"input 1: {TOO_LONG}"  # no protocol's words


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
    def config(*flags):
        return from_args(ServerConfig, build_parser().parse_args(["serve", *flags]))

    assert config().auto_truncate is True and config("--no-auto-truncate").auto_truncate is False
    monkeypatch.setenv("ATTNSERVE_AUTO_TRUNCATE", "false")
    assert config().auto_truncate is False and config("--auto-truncate").auto_truncate is True
    assert config().long_inputs == "refuse"  # TEI's flag is --long-inputs spelled another way: one rule
    monkeypatch.delenv("ATTNSERVE_AUTO_TRUNCATE")
    for flags, rule in ((["--long-inputs", "chunk"], "chunk"), (["--long-inputs", "refuse"], "refuse"),
                        (["--auto-truncate", "--long-inputs", "chunk"], "chunk"), ([], "truncate")):
        assert (config(*flags).long_inputs, config(*flags).auto_truncate) == (rule, rule != "refuse"), flags
    for flags in (["--no-auto-truncate", "--long-inputs", "chunk"], ["--auto-truncate", "--long-inputs", "refuse"]):
        with pytest.raises(ConfigError, match="disagree: give one of them"):
            config(*flags)


def test_clients_leave_an_unset_truncate_unset():
    """gRPC's optional field: unset and false differ on the wire (same field number, 6)."""
    assert [f.name for f, _ in make_request([LONG]).ListFields()] == ["inputs"]  # truncate not sent
    assert make_request([LONG], truncate=False).HasField("truncate")
    assert pb.EmbedRequest(truncate=False).SerializeToString() == b"\x30\x00"  # field 6, varint 0: sent
    assert pb.RerankRequest(truncate=False).SerializeToString() == b"\x28\x00"  # field 5
    assert from_args(LoadTestConfig, build_parser().parse_args(["loadtest"])).truncate is None
    assert from_args(LoadTestConfig, build_parser().parse_args(["loadtest", "--no-truncate"])).truncate is False
    assert build_parser().parse_args(["embed", "x"]).truncate is None
    assert build_parser().parse_args(["embed", "x", "--no-truncate"]).truncate is False


def test_grpc_embed_stream_and_attention_cut_an_unset_truncate_and_refuse_false(stub):
    reply = stub.Embed(make_request([LONG, "short"]), timeout=30)
    assert [(e.num_tokens, e.truncated) for e in reply.embeddings] == [(MAX, True), (3, False)]
    [streamed] = stub.EmbedStream(iter([make_request([LONG])]), timeout=30)
    assert (streamed.embeddings[0].num_tokens, streamed.embeddings[0].truncated) == (MAX, True)
    attention = stub.Embed(make_request([LONG], attention_layers=[-1], average_heads=True), timeout=30)
    assert attention.embeddings[0].truncated and list(attention.embeddings[0].attentions.shape) == [1, 1, MAX, MAX]
    assert stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).limits.auto_truncate
    with pytest.raises(grpc.RpcError) as refused:
        stub.Embed(make_request(["short", LONG], truncate=False), timeout=30)
    details = error_details(refused.value)
    assert details.code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.message == f"input 1: {TOO_LONG}" + BY_REQUEST.format(fix=GRPC_FIX)
    assert (details.field, details.description) == ("inputs[1].text", TOO_LONG)


def test_the_python_client_and_cli_leave_it_to_the_server(server, engine):
    with Client(server.target) as client:
        [result] = client.encode([LONG])
        assert (result.num_tokens, result.truncated) == (MAX, True)
        np.testing.assert_allclose(client.embed([LONG])[0], engine.encode([LONG]).embeddings[0], atol=1e-5)
        with pytest.raises(RequestError, match="the request asked not to truncate"):
            client.embed([LONG], truncate=False)
    result = run_cli("embed", LONG, "--target", server.target)
    assert result.returncode == 0, result.stderr
    [item] = json.loads(result.stdout)["embeddings"]
    assert (item["num_tokens"], item["truncated"]) == (MAX, True)
    assert_one_line_error(run_cli("embed", LONG, "--no-truncate", "--target", server.target),
                          "INVALID_ARGUMENT", "the request asked not to truncate")


def test_the_http_doors_cut_an_unset_truncate_through_their_clients(server, engine):
    """TEI's rule, `req.truncate.unwrap_or(auto_truncate)`: tei-client always sends its truncate (false unless told),
    so through it an over-long text is refused, naming the fix; unset (raw JSON, as LangChain's and LlamaIndex's TEI
    integrations send it) is cut."""
    want = engine.encode([LONG]).embeddings
    with openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        reply = client.embeddings.create(input=LONG, model=MODEL)
        assert reply.usage.prompt_tokens == MAX
        np.testing.assert_allclose(reply.data[0].embedding, want[0], atol=1e-5)
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(input=LONG, model=MODEL, extra_body={"truncate": False})
    assert refused.value.param == "input[0]"
    assert refused.value.body["message"] == f"input 0: {TOO_LONG}" + BY_REQUEST.format(fix=OPENAI_FIX)
    without_v1 = httpx.post(f"{server.http_url}/embeddings", json={"input": [LONG], "model": MODEL}, timeout=60)
    assert without_v1.status_code == 200 and without_v1.json()["usage"]["prompt_tokens"] == MAX
    embed = httpx.post(f"{server.http_url}/embed", json={"inputs": [LONG]}, timeout=60)
    np.testing.assert_allclose(np.array(embed.json(), dtype=np.float32), want, atol=1e-5)
    embed_all = httpx.post(f"{server.http_url}/embed_all", json={"inputs": [LONG]}, timeout=60)
    assert np.array(embed_all.json()[0]).shape == (MAX, 384)
    tei = HttpClient(server.http_url, timeout=60)
    assert tei.embed([LONG]) == {"error": f"input 0: {TOO_LONG}" + BY_REQUEST.format(fix=JSON_FIX),
                                 "error_type": "Validation"}
    np.testing.assert_allclose(np.array(tei.embed([LONG], truncate=True), dtype=np.float32), want, atol=1e-5)
    assert httpx.get(f"{server.http_url}/info", timeout=10).json()["auto_truncate"] is True
    reply = httpx.post(f"{server.http_url}/v1/attention", json={"inputs": LONG, "average_heads": True}, timeout=60)
    item = reply.json()["data"][0]
    assert (item["num_tokens"], item["truncated"], item["shape"]) == (MAX, True, [1, 1, MAX, MAX])
    refused = httpx.post(f"{server.http_url}/v1/attention", json={"inputs": LONG, "truncate": False}, timeout=60)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == f"input 0: {TOO_LONG}" + BY_REQUEST.format(fix=JSON_FIX)
    kserve = triton.InferenceServerClient(server.http_url.removeprefix("http://"), network_timeout=60)
    try:
        cut = kserve.infer(MODEL, [text_input([LONG], binary=True)])
        assert cut.as_numpy("num_tokens").tolist() == [MAX]
        np.testing.assert_allclose(cut.as_numpy("embedding"), want, atol=1e-5)
    finally:
        kserve.close()


def test_a_strict_server_refuses_an_unset_truncate_on_grpc_and_takes_true(strict):
    with strict.channel() as channel:
        stub = strict.stub(channel)
        details = grpc_refusal(stub.Embed, make_request([LONG]), timeout=30)
        assert details == f"input 0: {TOO_LONG}; " + BY_SERVER.format(fix=GRPC_FIX)
        cut = stub.Embed(make_request([LONG], truncate=True), timeout=30)
        assert (cut.embeddings[0].num_tokens, cut.embeddings[0].truncated) == (MAX, True)
        details = grpc_refusal(stub.Rerank, pb.RerankRequest(query=HUGE_QUERY, texts=["x"], model="reranker"),
                               timeout=30)
        assert details.endswith(BY_SERVER.format(fix="set truncate: true (field `truncate` of RerankRequest)"))
        assert len(stub.Rerank(pb.RerankRequest(query=HUGE_QUERY, texts=["x"], model="reranker", truncate=True),
                               timeout=30).results) == 1
        assert not stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).limits.auto_truncate


def test_a_strict_servers_http_doors_name_their_fix(strict):
    long_error = f"input 0: {TOO_LONG}; "
    with openai.OpenAI(base_url=f"{strict.http_url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(input=LONG, model="minilm")
        assert refused.value.body["message"] == long_error + BY_SERVER.format(fix=OPENAI_FIX)
        assert client.embeddings.create(input=LONG, model="minilm", extra_body={"truncate": True}
                                        ).usage.prompt_tokens == MAX
    embed = httpx.post(f"{strict.http_url}/embed", json={"inputs": [LONG]}, timeout=60)
    assert (embed.status_code, embed.json()) == (400, {"error": long_error + BY_SERVER.format(fix=JSON_FIX),
                                                       "error_type": "Validation"})
    assert httpx.get(f"{strict.http_url}/info", timeout=10).json()["auto_truncate"] is False
    attention = httpx.post(f"{strict.http_url}/v1/attention", json={"inputs": LONG}, timeout=60)
    assert attention.json()["error"]["message"] == long_error + BY_SERVER.format(fix=JSON_FIX)
    rerank = httpx.post(f"{strict.http_url}/v1/rerank", json={"query": HUGE_QUERY, "documents": ["x"],
                                                              "model": "reranker"}, timeout=60)
    assert rerank.status_code == 400 and rerank.json()["error"]["message"].endswith(BY_SERVER.format(fix=JSON_FIX))
    kserve = triton.InferenceServerClient(strict.http_url.removeprefix("http://"), network_timeout=60)
    try:
        with pytest.raises(InferenceServerException) as refused_kserve:
            kserve.infer("minilm", [text_input([LONG], binary=True)])
        assert refused_kserve.value.status() == "400"
        assert refused_kserve.value.message().startswith(long_error + "to cut it to max_seq_length instead, "
                                                         + KSERVE_FIX)
        assert kserve.infer("minilm", [text_input([LONG], binary=True)], parameters={"truncate": True}
                            ).as_numpy("num_tokens").tolist() == [MAX]
    finally:
        kserve.close()


def test_a_strict_servers_client_and_encode_server_follow_the_server(strict, tmp_path):
    with Client(strict.target) as client:
        with pytest.raises(RequestError, match="or start the server with --long-inputs truncate"):
            client.embed([LONG])
        assert client.encode([LONG], truncate=True)[0].truncated
    source = text_file(tmp_path / "in.txt", ["short", LONG])
    assert_one_line_error(run_cli("encode", source, "-o", tmp_path / "out.parquet", "--server", strict.target,
                                  "--no-progress"), "line 2", TOO_LONG)
