"""Quantized embeddings (engine/quantize.py) on every door and offline, byte for byte against sentence-transformers'
quantize_embeddings given the same ranges: Cohere's SDK on POST /v2/embed, TEI's /embed, gRPC Embed, KServe through
tritonclient, and `attnserve encode --precision-out`, against a real server and the artifacts' calibration."""

from __future__ import annotations

import base64
import json

import cohere
import numpy as np
import pyarrow.parquet as pq
import pytest
import requests
import tritonclient.http as triton
from sentence_transformers.util.quantization import quantize_embeddings

from attnserve.engine.manifest import load_manifest
from attnserve.engine.quantize import CALIBRATION_FILE, EMBEDDING_TYPES, calibration_ranges, quantize
from attnserve.offline.encode import read_embeddings
from attnserve.v1 import encoder_pb2 as pb
from tests.conftest import VARIED_TEXTS
from tests.offline_helpers import encoded, text_file
from tests.output_kinds import grpc_refusal
from tests.test_kserve import text_input

TEXTS = [t for t in VARIED_TEXTS if len(t) < 200][:6]
QUANTIZED = [t for t in EMBEDDING_TYPES if t != "float"]
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def st(embeddings: np.ndarray, kind: str, ranges: np.ndarray | None) -> np.ndarray:
    return quantize_embeddings(embeddings, "float32" if kind == "float" else kind, ranges=ranges)


def served_ranges(artifacts, dimensions=None) -> np.ndarray:
    return load_manifest(artifacts).quantization_ranges(dimensions, True)


def assert_codes(got, want, kind) -> None:
    """Two requests' floats come from the same batch shapes: the codes agree but where a value sits on a code's edge
    (none in practice; one code off at most)."""
    assert got.shape == want.shape
    assert np.abs(got.astype(np.int64) - want.astype(np.int64)).max() <= (0 if kind.endswith("binary") else 1)


@pytest.mark.parametrize("kind", EMBEDDING_TYPES)
def test_the_rule_is_sentence_transformers(kind):
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(40, 37)).astype(np.float32)  # 37: the last byte of a binary code is partial
    ranges = np.vstack((embeddings.min(0), embeddings.max(0)))
    ranges[:, 3] = 0.25  # one dimension with no spread: a step of 1, as sentence-transformers takes it
    for r in (ranges, ranges * 0.5):  # values outside the ranges are clipped, not wrapped
        got, want = quantize(embeddings, kind, r), st(embeddings, kind, r)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def test_export_keeps_calibration_embeddings(artifacts):
    manifest = load_manifest(artifacts)
    assert manifest.quantization is not None and manifest.quantization["file"] == CALIBRATION_FILE
    calibration = np.load(artifacts / CALIBRATION_FILE)
    assert calibration.shape == (manifest.quantization["texts"], manifest.embedding_size)
    # The graph's sentence embeddings (normalising is the engine's): the ranges normalise them as a request does.
    unit = calibration / np.linalg.norm(calibration, axis=1, keepdims=True)
    np.testing.assert_allclose(manifest.quantization_ranges(None, True), np.vstack((unit.min(0), unit.max(0))),
                               rtol=1e-6)
    np.testing.assert_array_equal(manifest.quantization_ranges(None, False),
                                  np.vstack((calibration.min(0), calibration.max(0))))
    cut = calibration[:, :64] / np.linalg.norm(calibration[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(manifest.quantization_ranges(64, True), np.vstack((cut.min(0), cut.max(0))),
                               rtol=1e-6)


@pytest.mark.parametrize("dimensions", [None, 128])
def test_cohere_v2_embed_every_type_in_one_request(server, artifacts, dimensions):
    reply = cohere.ClientV2(api_key="unused", base_url=server.http_url).embed(
        model="", input_type="search_document", texts=TEXTS, output_dimension=dimensions,
        embedding_types=["float", "int8", "uint8", "binary", "ubinary", "base64"])
    floats = np.array(reply.embeddings.float_, dtype=np.float32)
    assert floats.shape == (len(TEXTS), dimensions or load_manifest(artifacts).embedding_size)
    for kind in QUANTIZED:
        want = st(floats, kind, served_ranges(artifacts, dimensions))
        np.testing.assert_array_equal(np.array(getattr(reply.embeddings, kind)), want.astype(np.int64), err_msg=kind)
    decoded = np.stack([np.frombuffer(base64.b64decode(b), dtype="<f4") for b in reply.embeddings.base64])
    np.testing.assert_array_equal(decoded, floats)
    assert reply.texts == TEXTS and reply.meta.billed_units.input_tokens > 0


def test_cohere_v2_refusals_name_the_field(server):
    url = f"{server.http_url}/v2/embed"
    bad = requests.post(url, json={"model": "", "texts": ["a"], "embedding_types": ["int4"]}, timeout=30)
    assert bad.status_code == 400 and "embedding_types" in bad.text
    images = requests.post(url, json={"model": "", "images": ["data:image/png;base64,AA=="]}, timeout=30)
    assert images.status_code == 400 and "is a text model: it embeds no images" in images.json()["error"]["message"]
    short = requests.post(url, json={"model": "", "texts": ["a"], "max_tokens": 8}, timeout=30)
    assert short.status_code == 400 and "max_tokens" in short.json()["error"]["message"]


@pytest.mark.parametrize("kind", QUANTIZED)
def test_tei_embed_embedding_type(server, artifacts, kind):
    url = f"{server.http_url}/embed"
    floats = np.array(requests.post(url, json={"inputs": TEXTS}, timeout=30).json(), dtype=np.float32)
    got = np.array(requests.post(url, json={"inputs": TEXTS, "embedding_type": kind}, timeout=30).json())
    assert_codes(got, st(floats, kind, served_ranges(artifacts)), kind)


def test_tei_embed_with_the_requests_own_ranges(server):
    def post(**body):
        return requests.post(f"{server.http_url}/embed", json={"inputs": TEXTS, **body}, timeout=30)

    floats = np.array(post(dimensions=16).json(), dtype=np.float32)
    ranges = np.vstack((floats.min(0) - 0.01, floats.max(0) + 0.01))
    got = post(dimensions=16, embedding_type="uint8", ranges=ranges.tolist()).json()
    assert np.abs(np.array(got) - st(floats, "uint8", ranges).astype(np.int64)).max() <= 1
    wrong = post(dimensions=16, embedding_type="int8", ranges=ranges[:, :8].tolist())
    assert wrong.status_code in (400, 422) and "ranges must be two lists of 16 numbers" in wrong.text
    huge = post(dimensions=16, embedding_type="int8", ranges=[[-1e300] * 16, [1e300] * 16])  # inf in float32
    assert huge.status_code == 400 and "finite float32" in huge.text
    unused = post(ranges=ranges.tolist())
    assert unused.status_code in (400, 422) and "int8 and uint8" in unused.text


@pytest.mark.parametrize("kind", [pb.EMBEDDING_TYPE_INT8, pb.EMBEDDING_TYPE_UBINARY, pb.EMBEDDING_TYPE_BINARY])
def test_grpc_embedding_type(stub, artifacts, kind):
    inputs = [pb.Input(text=t) for t in TEXTS]
    floats = np.stack([np.frombuffer(e.sentence_embedding.data, "<f4")
                       for e in stub.Embed(pb.EmbedRequest(inputs=inputs)).embeddings])
    reply = stub.Embed(pb.EmbedRequest(inputs=inputs, embedding_type=kind))
    name = pb.EmbeddingType.Name(kind).removeprefix("EMBEDDING_TYPE_").lower()
    for row, e in zip(st(floats, name, served_ranges(artifacts)), reply.embeddings, strict=True):
        t = e.sentence_embedding
        assert t.dtype == (pb.UINT8 if name.startswith("u") else pb.INT8) and list(t.shape) == [len(row)]
        assert_codes(np.frombuffer(t.data, dtype=np.uint8 if t.dtype == pb.UINT8 else np.int8), row, name)


def test_grpc_ranges_of_the_wrong_shape_are_invalid(stub):
    ranges = pb.Tensor(shape=[2, 3], dtype=pb.FLOAT32, data=np.zeros(6, "<f4").tobytes())
    assert "ranges must be two lists of 384 numbers" in grpc_refusal(stub.Embed, pb.EmbedRequest(
        inputs=[pb.Input(text="a")], embedding_type=pb.EMBEDDING_TYPE_INT8, ranges=ranges))


@pytest.fixture(scope="module")
def floats_file(artifacts, tmp_path_factory):
    """TEXTS (in.txt beside it) encoded in floats, cut to 100 dimensions, by the command."""
    source = text_file(tmp_path_factory.mktemp("precision_out") / "in.txt", TEXTS)
    encoded(source, source.with_name("float.parquet"), "--artifacts", artifacts, "--dimensions", "100")
    return source.with_name("float.parquet")


@pytest.mark.parametrize("kind", QUANTIZED)
def test_offline_precision_out(artifacts, floats_file, tmp_path, kind):
    codes_file, flags = tmp_path / f"{kind}.parquet", ("--artifacts", artifacts, "--dimensions", "100")
    encoded(floats_file.with_name("in.txt"), codes_file, *flags, "--precision-out", kind)
    meta = json.loads(pq.read_table(codes_file).schema.metadata[b"attnserve"])
    assert meta["embedding_type"] == kind
    ranges = np.array(meta["ranges"], dtype=np.float32) if kind in ("int8", "uint8") else None
    if ranges is not None:
        np.testing.assert_array_equal(ranges, calibration_ranges(artifacts / CALIBRATION_FILE,
                                                                 load_manifest(artifacts).quantization["sha256"],
                                                                 100, True))
    got, want = read_embeddings(codes_file), st(read_embeddings(floats_file), kind, ranges)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()  # the same engine, the same batches
    # The same command again finds the run finished: byte-identical, as resuming keeps it.
    encoded(floats_file.with_name("in.txt"), codes_file, *flags, "--precision-out", kind)
    assert read_embeddings(codes_file).tobytes() == got.tobytes()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("kind", ["int8", "ubinary"])
def test_kserve_embedding_type_through_tritonclient(server, artifacts, kind, binary):
    client = triton.InferenceServerClient(server.http_url.removeprefix("http://"), network_timeout=60)
    try:
        wanted = [triton.InferRequestedOutput("embedding", binary_data=binary)]
        floats = client.infer(MODEL, [text_input(TEXTS, binary)], outputs=wanted).as_numpy("embedding")
        reply = client.infer(MODEL, [text_input(TEXTS, binary)], outputs=wanted, parameters={"embedding_type": kind})
    finally:
        client.close()
    got, want = reply.as_numpy("embedding"), st(floats, kind, served_ranges(artifacts))
    assert got.dtype == want.dtype and reply.get_output("embedding")["datatype"] == ("INT8" if kind == "int8" else
                                                                                     "UINT8")
    assert_codes(got, want, kind)
