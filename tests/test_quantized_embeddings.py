"""Quantized embeddings (engine/quantize.py) on every door and offline, byte for byte against sentence-transformers'
quantize_embeddings given the same ranges: Cohere's SDK on POST /v2/embed, TEI's /embed, gRPC Embed, and
`attnserve encode --precision-out`, against a real server and the exported artifacts' calibration."""

from __future__ import annotations

import base64
import json

import cohere
import numpy as np
import pyarrow.parquet as pq
import pytest
import requests
from sentence_transformers.util.quantization import quantize_embeddings

from attnserve.engine.manifest import load_manifest
from attnserve.engine.quantize import CALIBRATION_FILE, EMBEDDING_TYPES, calibration_ranges, quantize
from attnserve.offline.encode import read_embeddings
from attnserve.v1 import encoder_pb2 as pb
from tests.conftest import VARIED_TEXTS, run_cli

TEXTS = [t for t in VARIED_TEXTS if len(t) < 200][:6]
QUANTIZED = [t for t in EMBEDDING_TYPES if t != "float"]


def st(embeddings: np.ndarray, kind: str, ranges: np.ndarray | None) -> np.ndarray:
    return quantize_embeddings(embeddings, "float32" if kind == "float" else kind, ranges=ranges)


@pytest.mark.parametrize("kind", EMBEDDING_TYPES)
def test_the_rule_is_sentence_transformers(kind):
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(40, 37)).astype(np.float32)  # 37: the last byte of a binary code is partial
    ranges = np.vstack((embeddings.min(0), embeddings.max(0)))
    ranges[:, 3] = 0.25  # one dimension with no spread: a step of 1, as sentence-transformers takes it
    narrow = ranges * 0.5  # values outside the ranges are clipped, not wrapped
    for r in (ranges, narrow):
        got = quantize(embeddings, kind, r)
        want = st(embeddings, kind, r)
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


@pytest.fixture(scope="module")
def co(server):
    return cohere.ClientV2(api_key="unused", base_url=server.http_url)


@pytest.mark.parametrize("dimensions", [None, 128])
def test_cohere_v2_embed_every_type_in_one_request(co, artifacts, dimensions):
    manifest = load_manifest(artifacts)
    reply = co.embed(model="", input_type="search_document", texts=TEXTS, output_dimension=dimensions,
                     embedding_types=["float", "int8", "uint8", "binary", "ubinary", "base64"])
    floats = np.array(reply.embeddings.float_, dtype=np.float32)
    assert floats.shape == (len(TEXTS), dimensions or manifest.embedding_size)
    ranges = manifest.quantization_ranges(dimensions, True)
    for kind in QUANTIZED:
        got = np.array(getattr(reply.embeddings, kind))
        want = st(floats, kind, ranges)
        np.testing.assert_array_equal(got, want.astype(np.int64), err_msg=kind)
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
    ranges = load_manifest(artifacts).quantization_ranges(None, True)
    want = st(floats, kind, ranges)
    assert got.shape == want.shape
    # The two requests' floats come from the same batch shapes: the codes agree but where a value sits on a
    # code's edge (none in practice; allowed one code off at most).
    assert np.abs(got - want.astype(np.int64)).max() <= (0 if kind.endswith("binary") else 1)


def test_tei_embed_with_the_requests_own_ranges(server):
    url = f"{server.http_url}/embed"
    floats = np.array(requests.post(url, json={"inputs": TEXTS, "dimensions": 16}, timeout=30).json(),
                      dtype=np.float32)
    ranges = np.vstack((floats.min(0) - 0.01, floats.max(0) + 0.01))
    got = requests.post(url, json={"inputs": TEXTS, "dimensions": 16, "embedding_type": "uint8",
                                   "ranges": ranges.tolist()}, timeout=30).json()
    assert np.abs(np.array(got) - st(floats, "uint8", ranges).astype(np.int64)).max() <= 1
    wrong = requests.post(url, json={"inputs": TEXTS, "dimensions": 16, "embedding_type": "int8",
                                     "ranges": ranges[:, :8].tolist()}, timeout=30)
    assert wrong.status_code == 422 or wrong.status_code == 400
    assert "ranges must be two lists of 16 numbers" in wrong.text
    huge = requests.post(url, json={"inputs": TEXTS, "dimensions": 16, "embedding_type": "int8",
                                    "ranges": [[-1e300] * 16, [1e300] * 16]}, timeout=30)  # inf in float32
    assert huge.status_code == 400 and "finite float32" in huge.text
    unused = requests.post(url, json={"inputs": TEXTS, "ranges": ranges.tolist()}, timeout=30)
    assert unused.status_code in (400, 422) and "int8 and uint8" in unused.text


@pytest.mark.parametrize("kind", [pb.EMBEDDING_TYPE_INT8, pb.EMBEDDING_TYPE_UBINARY, pb.EMBEDDING_TYPE_BINARY])
def test_grpc_embedding_type(stub, artifacts, kind):
    inputs = [pb.Input(text=t) for t in TEXTS]
    floats = np.stack([np.frombuffer(e.sentence_embedding.data, "<f4")
                       for e in stub.Embed(pb.EmbedRequest(inputs=inputs)).embeddings])
    reply = stub.Embed(pb.EmbedRequest(inputs=inputs, embedding_type=kind))
    name = pb.EmbeddingType.Name(kind).removeprefix("EMBEDDING_TYPE_").lower()
    want = st(floats, name, load_manifest(artifacts).quantization_ranges(None, True))
    for row, e in zip(want, reply.embeddings, strict=True):
        t = e.sentence_embedding
        assert t.dtype == (pb.UINT8 if name.startswith("u") else pb.INT8) and list(t.shape) == [len(row)]
        got = np.frombuffer(t.data, dtype=np.uint8 if t.dtype == pb.UINT8 else np.int8)
        assert np.abs(got.astype(np.int64) - row.astype(np.int64)).max() <= (0 if name.endswith("binary") else 1)


def test_grpc_ranges_of_the_wrong_shape_are_invalid(stub):
    import grpc

    ranges = pb.Tensor(shape=[2, 3], dtype=pb.FLOAT32, data=np.zeros(6, "<f4").tobytes())
    with pytest.raises(grpc.RpcError) as raised:
        stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text="a")], embedding_type=pb.EMBEDDING_TYPE_INT8,
                                   ranges=ranges))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ranges must be two lists of 384 numbers" in raised.value.details()


def encode_cut_to_100(artifacts, source, out, *extra):
    result = run_cli("encode", str(source), "-o", str(out), "--artifacts", str(artifacts), "--no-progress",
                     "--dimensions", "100", *extra)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def floats_file(artifacts, tmp_path_factory):
    """TEXTS (in.txt beside it) encoded in floats, cut to 100 dimensions, by the command."""
    source = tmp_path_factory.mktemp("precision_out") / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    encode_cut_to_100(artifacts, source, source.parent / "float.parquet")
    return source.parent / "float.parquet"


@pytest.mark.parametrize("kind", QUANTIZED)
def test_offline_precision_out(artifacts, floats_file, tmp_path, kind):
    source, codes_file = floats_file.with_name("in.txt"), tmp_path / f"{kind}.parquet"
    encode_cut_to_100(artifacts, source, codes_file, "--precision-out", kind)
    table = pq.read_table(codes_file)
    meta = json.loads(table.schema.metadata[b"attnserve"])
    assert meta["embedding_type"] == kind
    ranges = np.array(meta["ranges"], dtype=np.float32) if kind in ("int8", "uint8") else None
    if ranges is not None:
        np.testing.assert_array_equal(ranges, calibration_ranges(artifacts / CALIBRATION_FILE,
                                                                 load_manifest(artifacts).quantization["sha256"],
                                                                 100, True))
    got, want = read_embeddings(codes_file), st(read_embeddings(floats_file), kind, ranges)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()  # the same engine, the same batches
    # The same command again finds the run finished: byte-identical, as resuming keeps it.
    encode_cut_to_100(artifacts, source, codes_file, "--precision-out", kind)
    assert read_embeddings(codes_file).tobytes() == got.tobytes()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("kind", ["int8", "ubinary"])
def test_kserve_embedding_type_through_tritonclient(server, artifacts, kind, binary):
    import tritonclient.http as triton

    from tests.test_kserve import MODEL, text_input

    client = triton.InferenceServerClient(server.http_url.removeprefix("http://"), network_timeout=60)
    try:
        wanted = [triton.InferRequestedOutput("embedding", binary_data=binary)]
        floats = client.infer(MODEL, [text_input(TEXTS, binary)], outputs=wanted).as_numpy("embedding")
        reply = client.infer(MODEL, [text_input(TEXTS, binary)], outputs=wanted,
                             parameters={"embedding_type": kind})
    finally:
        client.close()
    got = reply.as_numpy("embedding")
    want = st(floats, kind, load_manifest(artifacts).quantization_ranges(None, True))
    assert got.dtype == want.dtype and got.shape == want.shape
    assert reply.get_output("embedding")["datatype"] == ("INT8" if kind == "int8" else "UINT8")
    assert np.abs(got.astype(np.int64) - want.astype(np.int64)).max() <= (1 if kind == "int8" else 0)
