"""PyLate's ColBERT folders (model/pylate_colbert.py) against pylate 1.6.0's ColBERT.encode, whose vectors are
stored (tests/goldens/make_pylate_goldens.py made them, and the tiny folders beside them, in a venv of PyLate's own
pins): GTE-ModernColBERT's layout (ModernBERT, "[Q] " / "[D] " added tokens, expansion unattended), a BERT in
PyLate's layout without query expansion, and answerai-colbert-small's Stanford-NLP layout (HF_ColBERT, expansion
attended). Every vector at cosine >= 0.99999 and every text's vector count (markers, expansion, skip-list)
exactly PyLate's, in the engine, on /embed_multi, gRPC's multi_vector, the rerank doors (Cohere's v1 and v2, TEI's,
gRPC's) and `attnserve encode`."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import requests

from attnserve.config import EngineConfig
from attnserve.engine.engine import Engine
from attnserve.errors import CheckpointError
from attnserve.model.checkpoint import read_checkpoint
from attnserve.v1 import encoder_pb2 as pb
from tests.offline_helpers import encoded, text_file
from tests.output_kinds import export
from tests.serving import ServerProcess, serving

GOLDENS = Path(__file__).parent / "goldens" / "pylate"
MODELS = ("gte_moderncolbert", "bert_pylate", "answerai_colbert_small")
TEXTS = json.loads((GOLDENS / "texts.json").read_text(encoding="utf-8"))
QUERIES, DOCUMENTS = TEXTS["queries"], TEXTS["documents"]
KINDS = (("query", QUERIES), ("document", DOCUMENTS))


def pylate_vectors(name: str, input_type: str) -> list[np.ndarray]:
    """pylate's ColBERT.encode of QUERIES or DOCUMENTS: each text's (n_i, d) vectors."""
    stored = np.load(GOLDENS / f"{name}.npz")
    return [stored[f"{input_type}_{i}"] for i in range(len(QUERIES if input_type == "query" else DOCUMENTS))]


def check_vectors(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    """The same vector count per text, and every vector at cosine >= 0.99999 to PyLate's (got: (n_i, d) each, or
    its n_i * d floats)."""
    got = [np.asarray(g, np.float32).reshape(-1, w.shape[1]) for g, w in zip(got, want, strict=True)]
    assert [len(g) for g in got] == [len(w) for w in want]
    for g, w in zip(got, want, strict=True):
        cosine = (g * w).sum(1) / np.linalg.norm(g, axis=1) / np.linalg.norm(w, axis=1)  # (n_i,)
        assert cosine.min() >= 0.99999, cosine.min()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("pylate")
    return {name: export(GOLDENS / name, base / name, ["embeddings"]) for name in MODELS}


@pytest.fixture(scope="module")
def pylate_server(artifacts, tmp_path_factory):
    process = ServerProcess(None, *(a for name in MODELS for a in ("--model", f"{name}={artifacts[name]}")),
                            log_path=tmp_path_factory.mktemp("pylate_server") / "server.log")
    with serving(process):
        yield process


@pytest.mark.parametrize("name", MODELS)
def test_engine_vectors_equal_pylate(artifacts, name):
    engine = Engine.from_directory(artifacts[name], EngineConfig())
    assert engine.multi_vector is not None
    for input_type, texts in KINDS:
        got = engine.encode_multi_vector(engine.multi_vector.encode(texts, input_type), input_type).embeddings
        check_vectors(list(got), pylate_vectors(name, input_type))


def test_embed_multi_float_and_base64(pylate_server):
    url = f"{pylate_server.http_url}/embed_multi"
    for name in MODELS:
        for input_type, texts in KINDS:
            want = pylate_vectors(name, input_type)
            reply = requests.post(url, json={"model": name, "inputs": texts, "input_type": input_type}, timeout=60)
            assert reply.status_code == 200, reply.text
            check_vectors([np.array(v, np.float32) for v in reply.json()], want)
        reply = requests.post(url, json={"model": name, "inputs": DOCUMENTS, "encoding_format": "base64"}, timeout=60)
        assert reply.status_code == 200, reply.text
        check_vectors([np.frombuffer(base64.b64decode(v), "<f4") for v in reply.json()],
                      pylate_vectors(name, "document"))


def test_grpc_multi_vector(pylate_server):
    with pylate_server.channel() as channel:
        stub = pylate_server.stub(channel)
        for name in MODELS:
            for input_type, texts in KINDS:
                kind = pb.INPUT_TYPE_QUERY if input_type == "query" else pb.INPUT_TYPE_DOCUMENT
                reply = stub.Embed(pb.EmbedRequest(model=name, inputs=[pb.Input(text=t) for t in texts],
                                                   multi_vector=pb.MultiVectorOptions(input_type=kind)), timeout=60)
                got = [np.frombuffer(e.multi_vector.data, "<f4").reshape(tuple(e.multi_vector.shape))
                       for e in reply.embeddings]
                check_vectors(got, pylate_vectors(name, input_type))


def test_rerank_doors_score_by_maxsim_of_pylates_vectors(pylate_server):
    """Cohere's /v1/rerank and /v2/rerank, TEI's /rerank and gRPC's Rerank: MaxSim of PyLate's vectors."""
    for name in MODELS:
        query = pylate_vectors(name, "query")[0]
        want = np.array([(query @ doc.T).max(axis=1).sum() for doc in pylate_vectors(name, "document")])
        order = np.argsort(-want, kind="stable")
        for route in ("/v1/rerank", "/v2/rerank"):
            results = requests.post(f"{pylate_server.http_url}{route}", json={
                "model": name, "query": QUERIES[0], "documents": DOCUMENTS}, timeout=60).json()["results"]
            got = np.zeros(len(DOCUMENTS))
            got[[r["index"] for r in results]] = [r["relevance_score"] for r in results]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        tei = requests.post(f"{pylate_server.http_url}/rerank", json={
            "model": name, "query": QUERIES[0], "texts": DOCUMENTS}, timeout=60).json()
        np.testing.assert_allclose([r["score"] for r in tei], want[[r["index"] for r in tei]], rtol=1e-5, atol=1e-4)
        with pylate_server.channel() as channel:
            grpc_reply = pylate_server.stub(channel).Rerank(pb.RerankRequest(
                model=name, query=QUERIES[0], texts=DOCUMENTS, top_n=3), timeout=60)
        assert [r.index for r in grpc_reply.results] == order[:3].tolist()


def test_offline_encode_queries_and_documents(artifacts, pylate_server, tmp_path):
    """`attnserve encode --input-type`, locally and through the server (the documents of one line each)."""
    one_line = [i for i, t in enumerate(DOCUMENTS) if "\n" not in t]
    documents = text_file(tmp_path / "documents.txt", [DOCUMENTS[i] for i in one_line])
    queries = text_file(tmp_path / "queries.txt", QUERIES)
    for name, flags in (("gte_moderncolbert", ["--artifacts", str(artifacts["gte_moderncolbert"])]),
                        ("answerai_colbert_small", ["--server", pylate_server.target, "--model",
                                                    "answerai_colbert_small"])):
        for input_type, source, rows in (("query", queries, range(len(QUERIES))), ("document", documents, one_line)):
            out = tmp_path / f"{name}_{input_type}.parquet"
            encoded(source, out, *flags, "--input-type", input_type)
            got = [np.array(row, np.float32) for row in pq.read_table(out).column("multi_vector").to_pylist()]
            want = pylate_vectors(name, input_type)
            check_vectors(got, [want[i] for i in rows])


def copy_of(name: str, tmp_path: Path) -> Path:
    return shutil.copytree(GOLDENS / name, tmp_path / name)


def edit(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("change, words", [
    ({"query_prefix": "[QueryMarker]"}, "query marker '.QueryMarker.' is no token"),
    ({"document_length": 4096}, "document_length 4096: the model has only"),
    ({"query_length": 2}, "query_length must be an integer of at least 3"),
    ({"do_query_expansion": "yes"}, "do_query_expansion and attend_to_expansion_tokens must be true or false"),
    ({"skiplist_words": "!?"}, "skiplist_words must be a list of strings"),
    ({"similarity_fn_name": "cosine"}, "a PyLate ColBERT scores by MaxSim"),
])
def test_pylate_settings_it_cannot_reproduce_are_refused_in_one_line(tmp_path, change, words):
    folder = copy_of("gte_moderncolbert", tmp_path)
    edit(folder / "config_sentence_transformers.json", **change)
    with pytest.raises(CheckpointError, match=words):
        read_checkpoint(folder)


def test_pylate_layouts_it_cannot_reproduce_are_refused_in_one_line(tmp_path):
    folder = copy_of("bert_pylate", tmp_path)
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps(modules[:1]))  # PyLate would add an untrained Dense
    with pytest.raises(CheckpointError, match="PyLate modules Transformer .only a Transformer"):
        read_checkpoint(folder)
    (folder / "modules.json").write_text(json.dumps([*modules, {"idx": 2, "name": "2", "path": "2_Normalize",
                                                                "type": "sentence_transformers.models.Normalize"}]))
    with pytest.raises(CheckpointError, match="Transformer -> pylate.models.Dense.Dense -> Normalize"):
        read_checkpoint(folder)
    stanford = copy_of("answerai_colbert_small", tmp_path)
    edit(stanford / "artifact.metadata", doc_token_id="[DocumentMarker]")
    with pytest.raises(CheckpointError, match="document marker '.DocumentMarker.' is no token"):
        read_checkpoint(stanford)


def test_stanford_folders_it_cannot_reproduce_are_refused_in_one_line(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = copy_of("answerai_colbert_small", tmp_path)
    edit(folder / "artifact.metadata", query_maxlen="32")
    with pytest.raises(CheckpointError, match="query_length must be an integer"):
        read_checkpoint(folder)
    edit(folder / "artifact.metadata", query_maxlen=16)
    weights = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in weights.items() if k != "linear.weight"}, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"needs linear.weight of shape \(d, 32\), got None"):
        read_checkpoint(folder)


def test_a_folder_pylate_reads_without_its_settings_takes_pylates_defaults(tmp_path):
    """No config_sentence_transformers.json: PyLate loads a ColBERT still, with document_length 180, beyond this
    tiny ModernBERT's 128 positions."""
    folder = copy_of("gte_moderncolbert", tmp_path)
    (folder / "config_sentence_transformers.json").unlink()
    with pytest.raises(CheckpointError, match="document_length 180: the model has only 128 positions"):
        read_checkpoint(folder)


def test_too_long_inputs_are_refused_naming_the_length_the_marker_counts_in(pylate_server):
    reply = requests.post(f"{pylate_server.http_url}/embed_multi", json={
        "model": "gte_moderncolbert", "inputs": [QUERIES[2]], "input_type": "query", "truncate": False}, timeout=60)
    assert reply.status_code == 400 and "longer than query_length 12 tokens" in reply.json()["error"], reply.text


def test_a_pylate_default_prompt_goes_before_queries_and_documents_alike(tmp_path):
    folder = copy_of("gte_moderncolbert", tmp_path)
    edit(folder / "config_sentence_transformers.json", prompts={"query": "", "document": "", "both": "x: "},
         default_prompt_name="both")
    assert read_checkpoint(folder).pipeline.prompts == {"query": "x: ", "document": "x: "}
