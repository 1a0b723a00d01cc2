"""Long inputs (issue 34, item 10): --long-inputs chunk, checked against the same computation written out with
sentence-transformers' own modules, and late chunking, checked against a reference written with transformers'
AutoModel and its tokenizer's offsets. Both on a real server (gRPC and HTTP), late chunking also offline (local and
through a server; tests/test_ray_encode.py on Ray), on all-MiniLM-L6-v2 at its own max_seq_length (256)."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from attnserve.default_model import default_checkpoint_dir
from attnserve.v1 import encoder_pb2 as pb
from tests.serving import ServerProcess, serving

MAX = 256  # all-MiniLM-L6-v2's max_seq_length
LONG = " ".join(f"Sentence {i} tells of the {i}th river and its towns." for i in range(80))  # ~1,100 tokens
MEDIUM = " ".join(f"word{i} and more text" for i in range(60))  # ~330 tokens: two windows, the second short
DOC = ("The Eiffel Tower stands in Paris. It was finished in 1889! Berlin is the capital of Germany.\n"
       "Its population is about 3.8 million? The city is known for its art scene.")


@pytest.fixture(scope="module")
def chunking(artifacts, tmp_path_factory):
    process = ServerProcess(artifacts, "--long-inputs", "chunk",
                            log_path=tmp_path_factory.mktemp("chunking") / "server.log")
    with serving(process):
        yield process


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


# --- --long-inputs chunk ----------------------------------------------------------------------------------------

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
    # TEI's /embed says which inputs it chunked in a header (its body is the vectors alone)
    answer = httpx.post(f"{chunking.http_url}/embed", json={"inputs": texts}, timeout=120)
    assert answer.status_code == 200 and answer.headers["x-chunked-inputs"] == "0,2"
    assert "x-truncated-inputs" not in answer.headers
    np.testing.assert_allclose(np.asarray(answer.json()), vectors, atol=1e-6)


def test_every_window_has_the_prompt(chunking_stub, st_model):
    _, vectors = grpc_embeddings(chunking_stub, [MEDIUM], prompt="query: ")
    np.testing.assert_allclose(vectors[0], st_chunked(st_model, MEDIUM, "query: "), atol=2e-5)


def test_what_cannot_be_chunked_is_cut_and_marked(chunking, chunking_stub):
    """A request's own truncate wins; token ids, pairs and token-level outputs are cut, as truncate cuts them."""
    reply, _ = grpc_embeddings(chunking_stub, [LONG], truncate=True)
    assert (reply.embeddings[0].windows, reply.embeddings[0].truncated, reply.embeddings[0].num_tokens) == (0, True,
                                                                                                            MAX)
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


def test_openai_and_cohere_replies_mark_long_inputs_in_a_header(chunking):
    import openai

    client = openai.OpenAI(base_url=f"{chunking.http_url}/v1", api_key="unused")
    raw = client.embeddings.with_raw_response.create(model="sentence-transformers/all-MiniLM-L6-v2",
                                                     input=["short", LONG])
    assert raw.headers["x-chunked-inputs"] == "1" and len(raw.parse().data) == 2
    answer = httpx.post(f"{chunking.http_url}/v2/embed", timeout=60, json={
        "model": "", "texts": [LONG], "input_type": "search_document", "embedding_types": ["float"]})
    # Cohere's truncate is END unless said (its API's default): cut, and marked so
    assert answer.status_code == 200 and answer.headers["x-truncated-inputs"] == "0"
    # KServe v2, through tritonclient: the header on its reply, JSON or binary
    import tritonclient.http as triton

    client = triton.InferenceServerClient(chunking.http_url.removeprefix("http://"))
    for binary in (False, True):
        tensor = triton.InferInput("text", [2], "BYTES")
        tensor.set_data_from_numpy(np.array([b"short", LONG.encode()], dtype=np.object_), binary_data=binary)
        result = client.infer("sentence-transformers/all-MiniLM-L6-v2", [tensor], outputs=[
            triton.InferRequestedOutput("embedding", binary_data=binary)])
        assert result.get_response()["outputs"][0]["shape"] == [2, 384]
        answer = httpx.post(f"{chunking.http_url}/v2/models/sentence-transformers/all-MiniLM-L6-v2/infer", json={
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["short", LONG]}],
            "outputs": [{"name": "embedding", "parameters": {"binary_data": binary}}]}, timeout=60)
        assert answer.status_code == 200 and answer.headers["x-chunked-inputs"] == "1"
        assert answer.headers["content-type"] == ("application/octet-stream" if binary else "application/json")


# --- late chunking ------------------------------------------------------------------------------------------------

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
    room = MAX - 2
    tokens = []
    with torch.no_grad():
        for i in range(0, len(ids), room):
            window = torch.tensor([[tokenizer.cls_token_id, *ids[i:i + room], tokenizer.sep_token_id]])
            hidden = model(input_ids=window, attention_mask=torch.ones_like(window)).last_hidden_state[0]
            tokens.append(hidden[1:-1])  # the text's tokens alone
    hidden = torch.cat(tokens).double().numpy()  # (n, H)
    out = []
    for start, stop in spans:
        inside = (starts >= start) & (starts < stop)
        mean = hidden[inside].mean(axis=0)
        out.append(mean / np.linalg.norm(mean))
    return np.stack(out)


def chunk_vectors(embedding) -> tuple[list[tuple[int, int]], np.ndarray]:
    return ([(c.start, c.stop) for c in embedding.chunks],
            np.stack([np.frombuffer(c.embedding.data, "<f4") for c in embedding.chunks]))


def test_late_chunks_over_grpc_are_transformers_token_embeddings_pooled_per_span(stub, hf):
    spans = [(0, 33), (34, 60), (0, 60), (61, 96)]
    late = pb.LateChunking(spans=[pb.Spans(spans=[pb.Span(start=a, stop=b) for a, b in spans])])
    reply = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=DOC)], late_chunking=late), timeout=60)
    embedding = reply.embeddings[0]
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
    late = pb.LateChunking(spans=[pb.Spans(spans=[pb.Span(start=a, stop=b) for a, b in spans])])
    reply = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=DOC)], late_chunking=late, dimensions=64), timeout=60)
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


def test_late_chunking_refuses_what_it_cannot_pool(stub):
    import grpc

    chunker = pb.LateChunking(chunker="sentences")
    for request, message in (
            (pb.EmbedRequest(inputs=[pb.Input(token_ids=pb.TokenIds(ids=[101, 102]))], late_chunking=chunker),
             "late chunking reads texts"),
            (pb.EmbedRequest(inputs=[pb.Input(text=DOC)], late_chunking=chunker, pooling=pb.CLS),
             "pooling does not apply to late chunking"),
            (pb.EmbedRequest(inputs=[pb.Input(text=DOC)], late_chunking=chunker, truncate=True),
             "truncate does not apply to late chunking"),
            (pb.EmbedRequest(inputs=[pb.Input(text=DOC)], late_chunking=pb.LateChunking(chunker="words")),
             "chunker 'words' is not one of sentences, tokens")):
        with pytest.raises(grpc.RpcError) as refused:
            stub.Embed(request, timeout=60)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in refused.value.details()


# --- late chunking offline: one row per chunk ------------------------------------------------------------------------

def _late_input(tmp_path):
    rows = [{"id": "doc", "text": DOC}, {"id": "long", "text": LONG}, {"id": "ids", "token_ids": [101, 2023, 102]},
            {"id": "nothing", "text": "\u0000\u0001"}, {"id": "last", "text": "One more. And the end!"}]
    src = tmp_path / "docs.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return src


def test_an_offline_run_writes_a_row_per_chunk_as_transformers_computes_them(artifacts, hf, server, tmp_path):
    from attnserve.config import ClientConfig
    from attnserve.engine.engine import Engine
    from attnserve.offline.encode import encode_file
    from attnserve.offline.job import EncodeJob
    from attnserve.offline.remote import encode_file_remote
    from attnserve.offline.rows import LateChunks

    src, local, remote = _late_input(tmp_path), tmp_path / "local.parquet", tmp_path / "remote.parquet"
    job = dict(progress=False, on_error="skip", late_chunking=LateChunks("sentences"))
    stats = encode_file(Engine.from_directory(artifacts), EncodeJob(src, local, **job))
    assert stats.texts == 3 and stats.skipped == 2
    table = pq.read_table(local)
    assert table.column_names == ["id", "chunk", "start", "stop", "embedding", "num_tokens"]
    rows = table.drop(["embedding"]).to_pylist()
    texts = {"doc": DOC, "long": LONG, "last": "One more. And the end!"}
    assert [r["id"] for r in rows if r["chunk"] == 0] == ["doc", "long", "last"]  # the input's order
    for name, text in texts.items():
        mine = [r for r in rows if r["id"] == name]
        assert [r["chunk"] for r in mine] == list(range(len(mine)))
        spans = [(r["start"], r["stop"]) for r in mine]
        vectors = np.stack([v for v, r in zip(table.column("embedding").to_pylist(), rows, strict=True)
                            if r["id"] == name])
        np.testing.assert_allclose(vectors, hf_late_chunks(hf, text, spans), atol=2e-5)
    assert len([r for r in rows if r["id"] == "long"]) == 80  # a sentence each, across its windows
    reasons = [json.loads(line)["reason"] for line in (tmp_path / "local.errors.jsonl").read_text().splitlines()]
    assert reasons == ["late chunking reads texts: this input is token ids",
                       "no token to chunk: the tokenizer keeps nothing of the text"]
    # through a server: the same rows, and the same rows set aside
    encode_file_remote(EncodeJob(src, remote, **job), ClientConfig(target=server.target))
    got = pq.read_table(remote)
    assert got.drop(["embedding"]).equals(table.drop(["embedding"]))
    np.testing.assert_allclose(np.stack(got.column("embedding").to_pylist()),
                               np.stack(table.column("embedding").to_pylist()), atol=1e-6)
    assert (tmp_path / "remote.errors.jsonl").read_text() == (tmp_path / "local.errors.jsonl").read_text()


def test_the_encode_command_takes_late_chunking_flags(artifacts, tmp_path):
    from tests.conftest import assert_one_line_error, run_cli

    src = tmp_path / "docs.txt"
    src.write_text(DOC + "\nSecond line. Two sentences.\n")
    out = tmp_path / "out.parquet"
    done = run_cli("encode", src, "-o", out, "--artifacts", artifacts, "--late-chunking", "tokens",
                   "--chunk-tokens", "5", "--dimensions", "32", "--no-progress")
    assert done.returncode == 0, done.stderr
    table = pq.read_table(out)
    assert set(table.column("num_tokens").to_pylist()) <= set(range(1, 6))
    assert table.schema.field("embedding").type.list_size == 32
    assert_one_line_error(run_cli("encode", src, "-o", tmp_path / "x.parquet", "--artifacts", artifacts,
                                  "--late-chunking", "sentences", "--chunk-tokens", "5"),
                          "--chunk-tokens goes with --late-chunking tokens")
    assert_one_line_error(run_cli("encode", src, "-o", tmp_path / "y.parquet", "--artifacts", artifacts,
                                  "--late-chunking", "tokens", "--precision-out", "int8"),
                          "--precision-out does not apply to --late-chunking")
    assert_one_line_error(run_cli("encode", src, "-o", tmp_path / "z.parquet", "--artifacts", artifacts,
                                  "--late-chunking", "tokens", "--chunk-tokens", "0"),
                          "--chunk-tokens must be positive, got 0")
