"""The sentence-transformers modules after the encoder, exported and checked against sentence-transformers itself:
folders saved by its own classes over all-MiniLM-L6-v2's weights (max_seq_length 32: exports of seconds) with every
Pooling mode concatenated, Dense layers with Normalize between and after, named and default prompts. Each encodes as
`SentenceTransformer(folder).encode` does: cosine >= 0.99999 and max abs <= 1e-4.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import torch

from attnserve.client.client import make_request, to_result
from attnserve.engine.engine import Engine
from attnserve.engine.pooling import pool as numpy_pool
from attnserve.errors import InvalidInputError
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import read_checkpoint
from attnserve.model.pooling import pool as torch_pool
from attnserve.pooling_modes import POOLING_MODES
from attnserve.v1 import encoder_pb2 as pb

from .checkpoints import save_pipeline
from .conftest import VARIED_TEXTS, run_cli
from .serving import ServerProcess, serving

# Past 32 tokens (truncated), unicode, one letter: the varied texts, and a few short ones.
TEXTS = VARIED_TEXTS + ["hello world", "query: already prompted", "A LONGER sentence, with punctuation!"]
PROMPTS = {"query": "query: ", "passage": "passage: ", "empty": ""}
MAX_SEQ_LENGTH = 32


def assert_parity(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    cosine = (ours * theirs).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(theirs, axis=-1))
    assert cosine.min() >= 0.99999, cosine.min()
    assert np.abs(ours - theirs).max() <= 1e-4, np.abs(ours - theirs).max()


@pytest.mark.parametrize("mode", POOLING_MODES)
def test_each_pooling_mode_agrees_in_torch_numpy_and_sentence_transformers(mode):
    from sentence_transformers.sentence_transformer.modules import Pooling

    rng = np.random.default_rng(0)
    lengths = np.array([1, 9, 5, 3])
    hidden = rng.normal(size=(4, 9, 16)).astype(np.float32)  # (B, T, H), padding rows random too
    mask = (np.arange(9)[None, :] < lengths[:, None]).astype(np.int64)  # (B, T) right padding
    theirs = Pooling(16, mode)({"token_embeddings": torch.from_numpy(hidden),
                                "attention_mask": torch.from_numpy(mask)})["sentence_embedding"].numpy()
    ours_torch = torch_pool(torch.from_numpy(hidden), torch.from_numpy(mask), mode).numpy()
    ours_numpy = numpy_pool(hidden, lengths, mode)
    assert ours_numpy.dtype == np.float32
    np.testing.assert_allclose(ours_torch, theirs, atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(ours_numpy, theirs, atol=1e-6, rtol=1e-6)


def build(checkpoint: Path, out: Path) -> Engine:
    """The fp32 graphs (plain and fused): the pipeline's modules are the same in every variant, which the default
    model's export (tests/conftest.py) builds and verifies whole."""
    build_artifacts(read_checkpoint(checkpoint), out, log=lambda m: None, variants=["embeddings", "embeddings_fused"])
    return Engine.from_directory(out)


@pytest.fixture(scope="module")
def every_pooling(checkpoint, tmp_path_factory) -> tuple[Path, Engine]:
    """MiniLM with all six pooling modes concatenated, no Normalize, and prompts with a default."""
    from sentence_transformers.sentence_transformer.modules import Pooling

    folder = save_pipeline(checkpoint.directory, tmp_path_factory.mktemp("pooling") / "st",
                           lambda size: [Pooling(size, POOLING_MODES)], MAX_SEQ_LENGTH,
                           prompts=PROMPTS, default_prompt_name="query")
    return folder, build(folder, folder.parent / "artifacts")


@pytest.fixture(scope="module")
def dense(checkpoint, tmp_path_factory) -> tuple[Path, Engine]:
    """MiniLM -> mean -> Dense(384->256, tanh) -> Normalize -> Dense(256->128, identity, residual) -> Normalize."""
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling

    torch.manual_seed(0)
    folder = save_pipeline(checkpoint.directory, tmp_path_factory.mktemp("dense") / "st", lambda size: [
        Pooling(size, "mean"), Dense(size, 256), Normalize(),
        Dense(256, 128, activation_function=torch.nn.Identity(), use_residual=True), Normalize()], MAX_SEQ_LENGTH)
    return folder, build(folder, folder.parent / "artifacts")


def sentence_transformers(folder: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


def test_every_pooling_mode_concatenated_and_prompts_encode_as_sentence_transformers(every_pooling):
    folder, engine = every_pooling
    manifest, model = engine.manifest, sentence_transformers(folder)
    assert (manifest.hidden_size, manifest.embedding_size, manifest.normalize) == (384, 6 * 384, False)
    assert manifest.pooling == "cls+max+mean+mean_sqrt_len_tokens+weightedmean+lasttoken"
    assert manifest.modules == ("Transformer(bert)", f"Pooling({manifest.pooling})")
    # sentence-transformers saves its own empty "document" prompt beside the model's.
    raw = json.loads((manifest.directory / "manifest.json").read_text())
    assert (raw["prompts"], raw["default_prompt_name"]) == ({**PROMPTS, "document": ""}, "query")
    default = engine.encode(TEXTS).embeddings  # the default prompt, "query: ", before each text
    theirs = model.encode(TEXTS)
    assert_parity(default, theirs)
    for i in range(len(POOLING_MODES)):
        assert_parity(default[:, i * 384:(i + 1) * 384], theirs[:, i * 384:(i + 1) * 384])
    assert_parity(default, engine.encode(TEXTS, prompt_name="query").embeddings)
    passage = engine.encode(TEXTS, prompt_name="passage").embeddings
    assert_parity(passage, model.encode(TEXTS, prompt_name="passage"))
    assert_parity(engine.encode(TEXTS, prompt="custom: ").embeddings, model.encode(TEXTS, prompt="custom: "))
    assert_parity(engine.encode(TEXTS, prompt_name="empty").embeddings, model.encode(TEXTS, prompt_name="empty"))
    assert np.abs(default - passage).max() > 1e-2  # the prompt really changes the embedding
    with pytest.raises(InvalidInputError, match="prompt_name 'missing' does not exist: this model's prompts are "
                                                "'document', 'empty', 'passage', 'query'"):
        engine.encode(TEXTS, prompt_name="missing")


def test_dense_layers_and_normalize_in_between_encode_as_sentence_transformers(dense):
    folder, engine = dense
    manifest = engine.manifest
    assert (manifest.hidden_size, manifest.embedding_size, manifest.normalize, manifest.pooling) == (
        384, 128, True, "mean")
    assert manifest.modules == ("Transformer(bert)", "Pooling(mean)", "Dense(384->256, tanh)", "Normalize",
                                "Dense(256->128, identity, residual)", "Normalize")
    encoded = engine.encode(TEXTS)
    assert encoded.embeddings.shape == (len(TEXTS), 128)
    assert_parity(encoded.embeddings, sentence_transformers(folder).encode(TEXTS))
    # The graph stops before the trailing Normalize: asked not to normalise, the engine gives the vector before it.
    raw = engine.encode(TEXTS, normalize=False).embeddings
    assert np.abs(np.linalg.norm(raw, axis=1) - 1).max() > 1e-3
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), encoded.embeddings, atol=1e-6)


def test_a_server_serves_the_pipelines_embeddings_and_refuses_another_pooling(dense, tmp_path):
    """Another pooling is refused on request, and at start (`serve --pooling cls`): the embedding is more than one."""
    _, engine = dense
    with serving(ServerProcess(engine.manifest.directory, log_path=tmp_path / "server.log")) as process:
        with process.channel() as channel:
            stub = process.stub(channel)
            info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
            assert (info.hidden_size, info.embedding_size, info.pooling, info.normalize) == (384, 128, "mean", True)

            def embed(**options) -> np.ndarray:
                reply = stub.Embed(make_request(TEXTS, truncate=True, **options), timeout=60)
                return np.stack([to_result(e).sentence_embedding for e in reply.embeddings])

            np.testing.assert_allclose(embed(), engine.encode(TEXTS).embeddings, atol=2e-6)
            np.testing.assert_allclose(embed(pooling="mean"), embed(), atol=0)  # the model's own: the graph's
            assert embed(dimensions=64).shape == (len(TEXTS), 64)
            for options, message in (({"pooling": "cls"}, "pooling cls is not available for this model: its "
                                       "pipeline is Transformer(bert) -> Pooling(mean) -> Dense(384->256, tanh)"),
                                     ({"dimensions": 129}, "this model's embeddings have 128 (ask for 1 to 128)")):
                with pytest.raises(grpc.RpcError) as error:
                    embed(**options)
                assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert message in error.value.details(), error.value.details()
    refused = ServerProcess(engine.manifest.directory, "--pooling", "cls", log_path=tmp_path / "refused.log")
    assert refused.process.wait(120) != 0
    log = refused.log_tail()
    assert ("--pooling cls: model 'st' cannot be pooled otherwise: its pipeline is Transformer(bert) -> "
            "Pooling(mean) -> Dense(384->256, tanh)") in log, log
    assert "Traceback" not in log


def test_request_time_pooling_is_refused_where_the_model_pools_otherwise(every_pooling, artifacts):
    from attnserve.engine.manifest import load_manifest
    from attnserve.server.embed_requests import prepare
    from attnserve.server.requests import EncodeRequest, RequestLimits

    _, engine = every_pooling
    limits = RequestLimits(max_inputs=8, max_response_bytes=2**20)
    with pytest.raises(InvalidInputError, match="pooling mean is not available for this model") as error:
        prepare(EncodeRequest(["a"], pooling="mean"), engine.tokenizer, engine.manifest, limits, 4)
    assert error.value.field == "pooling"
    # An artifact directory exported before the manifest had `modules` keeps its request-time poolings.
    minilm = load_manifest(artifacts)
    assert minilm.poolable_at_request_time and minilm.embedding_size == minilm.hidden_size == 384
    with pytest.raises(InvalidInputError, match="prompt_name 'query' does not exist: the model has no prompts"):
        prepare(EncodeRequest(["a"], prompt_name="query"), engine.tokenizer, minilm, limits, 4)
    prepared = prepare(EncodeRequest(["a"], prompt_name="passage"), engine.tokenizer, engine.manifest, limits, 4)
    assert engine.tokenizer.tokens(prepared.inputs[0].ids) == ["[CLS]", "passage", ":", "a", "[SEP]"]


def test_offline_encoding_writes_the_pipelines_size_with_the_default_prompt(every_pooling, tmp_path):
    from attnserve.offline.encode import read_embeddings

    folder, engine = every_pooling
    texts = [t for t in TEXTS if "\n" not in t]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    result = run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "out.parquet", "--artifacts",
                     engine.manifest.directory, "--no-progress")
    assert result.returncode == 0, result.stderr
    written = read_embeddings(tmp_path / "out.parquet")
    assert written.shape == (len(texts), 6 * 384)
    assert_parity(written, sentence_transformers(folder).encode(texts))


def test_serve_pooling_cls_on_a_mean_model_equals_sentence_transformers_cls_pooling(checkpoint, artifacts, tmp_path):
    """`serve --pooling cls` (TEI's --pooling; its tests run CLS pooling on a mean-pooling model): a request that
    names no pooling gets CLS pooling on every door, equal to sentence-transformers' own Pooling(cls) over the same
    weights; the server says so in its info; a request's own pooling still wins."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    transformer = Transformer(str(checkpoint.directory), max_seq_length=256)
    cls = SentenceTransformer(modules=[transformer, Pooling(384, "cls"), Normalize()], device="cpu")
    texts = [t for t in TEXTS if len(t) < 400]
    want = cls.encode(texts)
    mean = Engine.from_directory(artifacts).encode(texts, normalize=True).embeddings
    with serving(ServerProcess(artifacts, "--pooling", "cls", log_path=tmp_path / "server.log")) as process:
        url = process.http_url
        tei = np.array(httpx.post(f"{url}/embed", json={"inputs": texts}, timeout=60).json(), dtype=np.float32)
        assert_parity(tei, want)
        openai = httpx.post(f"{url}/v1/embeddings", json={"input": texts, "model": ""}, timeout=60).json()
        assert_parity(np.array([d["embedding"] for d in openai["data"]], dtype=np.float32), want)
        similarity = httpx.post(f"{url}/similarity", json={"inputs": {"source_sentence": texts[0],
                                                                      "sentences": texts[1:3]}}, timeout=60).json()
        np.testing.assert_allclose(similarity, want[1:3] @ want[0], atol=1e-4)
        with process.channel() as channel:
            stub = process.stub(channel)
            reply = stub.Embed(make_request(texts, truncate=True), timeout=60)
            assert_parity(np.stack([to_result(e).sentence_embedding for e in reply.embeddings]), want)
            assert stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).pooling == "cls"
        assert httpx.get(f"{url}/info", timeout=30).json()["model_type"] == {"embedding": {"pooling": "cls"}}
        own = httpx.post(f"{url}/embed", json={"inputs": texts, "pooling": "mean"}, timeout=60).json()
        np.testing.assert_allclose(np.array(own, dtype=np.float32), mean, atol=1e-5)
