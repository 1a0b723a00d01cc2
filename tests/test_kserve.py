"""KServe v2's HTTP routes, called by Triton's own client (tritonclient.http) and by hand for what it never sends,
against a real `attnserve serve` process; vectors checked against the offline engine."""

from __future__ import annotations

import json
import struct
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.conftest import VARIED_TEXTS

MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # a slash in the name, which tritonclient does not escape
TEXTS = [t for t in VARIED_TEXTS if len(t) < 200]
LONG = "The beginning of a long text. " + "filler words " * 150 + "and its very different ending!"


@pytest.fixture(scope="module")
def client(server):
    client = triton.InferenceServerClient(server.http_url.removeprefix("http://"), network_timeout=60)
    yield client
    client.close()


def text_input(texts: list[str], binary: bool, shape: tuple[int, ...] | None = None) -> triton.InferInput:
    array = np.array([t.encode() for t in texts], dtype=np.object_)
    if shape is not None:
        array = array.reshape(shape)
    tensor = triton.InferInput("text", list(array.shape), "BYTES")
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def outputs(binary: bool) -> list[triton.InferRequestedOutput]:
    return [triton.InferRequestedOutput(name, binary_data=binary) for name in ("embedding", "num_tokens")]


def post(server, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(server.http_url + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def infer_body(tensor: dict, **extra) -> bytes:
    return json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", **tensor}], **extra}).encode()


def test_server_and_model_are_described(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata()["extensions"] == ["binary_tensor_data", "model_configuration",
                                                          "model_repository", "statistics"]
    assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "1")
    metadata = client.get_model_metadata(MODEL)
    assert metadata["name"] == MODEL and metadata["versions"] == ["1"]
    assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]},
                                   {"name": "num_tokens", "datatype": "INT32", "shape": [-1]},
                                   {"name": "token_embeddings", "datatype": "FP32", "shape": [-1, -1, 384]}]
    assert client.get_model_metadata(MODEL, "1") == metadata


def test_model_config_and_repository_index_for_perf_analyzer(server, client):
    """Triton's model_configuration and model_repository extensions, as tritonclient.http (and perf_analyzer, which
    reads the same JSON) calls them."""
    config = client.get_model_config(MODEL)
    assert config["name"] == MODEL and config["max_batch_size"] == 0 and config["backend"] == "attnserve"
    assert config["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": [-1]}]
    assert config["output"] == [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [-1, 384]},
                                {"name": "num_tokens", "data_type": "TYPE_INT32", "dims": [-1]},
                                {"name": "token_embeddings", "data_type": "TYPE_FP32", "dims": [-1, -1, 384]}]
    assert config["parameters"]["max_seq_length"] == {"string_value": "256"}
    assert client.get_model_config(MODEL, "1") == config
    assert client.get_model_repository_index() == [{"name": MODEL, "version": "1", "state": "READY"}]
    status, body = post(server, "/v2/repository/index", b'{"ready": true}')
    assert status == 200 and body == [{"name": MODEL, "version": "1", "state": "READY"}]
    status, body = post(server, "/v2/repository/index", b'{"ready": "yes"}')
    assert status == 400 and "ready" in body["error"]
    status, body = post(server, f"/v2/models/{MODEL}/config", b"{}")  # the config is read with GET
    assert status == 405 and set(body) == {"error"}
    with pytest.raises(InferenceServerException) as error:
        client.get_model_config(MODEL, "2")
    assert error.value.status() == "404" and "has no version '2'" in error.value.message()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_equals_the_offline_engine(client, engine, binary):
    reply = client.infer(MODEL, [text_input(TEXTS, binary)], outputs=outputs(binary), request_id="req-7")
    expected = engine.encode(TEXTS)  # the model's own pipeline normalises
    np.testing.assert_allclose(reply.as_numpy("embedding"), expected.embeddings, atol=1e-5)
    assert reply.as_numpy("embedding").dtype == np.float32
    np.testing.assert_array_equal(reply.as_numpy("num_tokens"), [len(x) for x in engine.tokenizer.encode_texts(TEXTS)])
    assert reply.get_response()["id"] == "req-7" and reply.get_response()["model_version"] == "1"


def test_every_output_by_default_and_an_n_by_1_shape(server, client, engine):
    reply = client.infer(MODEL, [text_input(TEXTS[:4], True, (4, 1))])
    assert {o["name"] for o in reply.get_response()["outputs"]} == {"embedding", "num_tokens"}
    np.testing.assert_allclose(reply.as_numpy("embedding"), engine.encode(TEXTS[:4]).embeddings, atol=1e-5)
    # An empty list of outputs is no list, as in KServe's protobuf form: every output.
    status, body = post(server, f"/v2/models/{MODEL}/infer", infer_body({"shape": [1], "data": ["a"]}, outputs=[]))
    assert status == 200 and [o["name"] for o in body["outputs"]] == ["embedding", "num_tokens"]


def test_parameters_truncate_normalize_and_dimensions(client, engine):
    with pytest.raises(InferenceServerException) as refused:
        client.infer(MODEL, [text_input([LONG], True)], parameters={"truncate": False})
    assert refused.value.status() == "400" and "longer than max_seq_length 256" in refused.value.message()
    assert 'set "parameters": {"truncate": true} in the request' in refused.value.message()
    cut = client.infer(MODEL, [text_input([LONG], True)], parameters={"truncate": True})
    assert cut.as_numpy("num_tokens").tolist() == [256]
    np.testing.assert_allclose(cut.as_numpy("embedding"), engine.encode([LONG]).embeddings, atol=1e-5)
    raw = client.infer(MODEL, [text_input(TEXTS[:3], True)], parameters={"normalize": False})
    np.testing.assert_allclose(raw.as_numpy("embedding"), engine.encode(TEXTS[:3], normalize=False).embeddings,
                               atol=1e-5)
    short = client.infer(MODEL, [text_input(TEXTS[:3], True)], parameters={"dimensions": 64}).as_numpy("embedding")
    first = engine.encode(TEXTS[:3], normalize=False).embeddings[:, :64]
    np.testing.assert_allclose(short, first / np.linalg.norm(first, axis=1, keepdims=True), atol=1e-5)


@pytest.mark.parametrize("call, status, message", [
    (lambda c: c.infer("nope", [text_input(["a"], True)]), "404", "the model 'nope' does not exist here"),
    (lambda c: c.infer(MODEL, [text_input(["a"], True)], model_version="2"), "404", "has no version '2'"),
    (lambda c: c.infer(MODEL, [text_input([""], True)]), "400", "input 0: empty text"),
    (lambda c: c.infer(MODEL, [text_input(["a"], True)], outputs=[triton.InferRequestedOutput("logits")]), "400",
     "outputs[0].name: no output 'logits'; the outputs are embedding, num_tokens, token_embeddings"),
    (lambda c: c.infer(MODEL, [text_input(["a"], True)], parameters={"truncate": "yes"}), "400",
     "parameters.truncate: must be a boolean, got 'yes'"),
    (lambda c: c.infer(MODEL, [text_input(["a", "b"], True, (1, 2))]), "400",
     "inputs[0].shape: 'text' is [N] or [N, 1], got [1, 2]"),
    (lambda c: c.infer(MODEL, [text_input(["a"], True)], parameters={"dimensions": 8.0}), "400",
     "parameters.dimensions: must be an integer, written without a fraction or exponent: 8, not 8.0"),
], ids=["model", "version", "empty", "output", "parameter", "shape", "float-integer"])
def test_triton_client_errors(client, call, status, message):
    with pytest.raises(InferenceServerException) as error:
        call(client)
    assert error.value.status() == status and message in error.value.message()
    assert client.is_server_ready()


def binary_strings(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


@pytest.mark.parametrize("tensor, tail, header_extra, message", [
    ({"shape": [2], "data": ["a"]}, b"", 0, "inputs[0].data: shape [2] holds 2 elements, the data has 1"),
    ({"shape": [1], "data": [5]}, b"", 0, "inputs[0].data[0]: must be a string, got int"),
    ({"shape": [1], "datatype": "FP32", "data": [1.0]}, b"", 0, "inputs[0].datatype: 'text' is BYTES"),
    ({"shape": [10 ** 12], "parameters": {"binary_data_size": 8}}, binary_strings(b"abcd"), 0,
     "inputs[0]: shape holds 1000000000000 elements, but 8 bytes cannot"),
    ({"shape": [1], "parameters": {"binary_data_size": 5}}, struct.pack("<I", 99) + b"a", 0,
     "inputs[0]: element 0 is 99 bytes, past the tensor's bytes"),
    ({"shape": [1], "parameters": {"binary_data_size": 6}}, binary_strings(b"\xff\xfe"), 0,
     "inputs[0].data[0]: not UTF-8 text"),
    ({"shape": [1], "parameters": {"binary_data_size": 7}}, binary_strings(b"ab") + b"x", 0,
     "inputs[0]: 1 bytes follow the tensor's 1 elements"),
    ({"shape": [1], "parameters": {"binary_data_size": 50}}, binary_strings(b"ab"), 0,
     "binary_data_size is 50, but only 6 bytes follow the JSON"),
    ({"shape": [1], "parameters": {"binary_data_size": 6}}, binary_strings(b"ab"), 100, "but the body holds"),
    ({"shape": [1]}, b"", 0, "give 'text''s elements once, either typed (data, contents) or as raw bytes"),
    ({"shape": [1.0], "data": ["a"]}, b"", 0,
     "inputs[0].shape[0]: must be an integer, written without a fraction or exponent: 1, not 1.0"),
], ids=["count", "element-type", "datatype", "huge-shape", "element-overrun", "utf8", "trailing", "size-overrun",
        "header-overrun", "no-data", "float-shape"])
def test_hostile_tensors_get_a_clear_400(server, tensor, tail, header_extra, message):
    header = infer_body({"datatype": "BYTES", **tensor})
    status, body = post(server, f"/v2/models/{MODEL}/infer", header + tail,
                        {"Inference-Header-Content-Length": str(len(header) + header_extra)})
    assert status == 400 and set(body) == {"error"} and message in body["error"], body


def test_a_binary_tensor_by_hand_and_an_input_of_another_name(server, engine):
    header = infer_body({"shape": [2], "parameters": {"binary_data_size": 14}})
    status, body = post(server, f"/v2/models/{MODEL}/versions/1/infer", header + binary_strings(b"hello", b"a"),
                        {"Inference-Header-Content-Length": str(len(header))})
    assert status == 200
    embedding = next(o for o in body["outputs"] if o["name"] == "embedding")
    assert embedding["shape"] == [2, 384]
    np.testing.assert_allclose(np.array(embedding["data"], np.float32).reshape(2, 384),
                               engine.encode(["hello", "a"]).embeddings, atol=1e-5)
    other = json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1], "data": [1]}]})
    status, body = post(server, f"/v2/models/{MODEL}/infer", other.encode())
    assert status == 400 and "takes 'text', not 'input_ids'" in body["error"]
    for length in ("²", "-1", "abc"):  # "²" passes str.isdigit() and fails int()
        status, body = post(server, f"/v2/models/{MODEL}/infer", b"{}", {"Inference-Header-Content-Length": length})
        assert status == 400 and "is not a byte count" in body["error"], (length, body)
    status, body = post(server, "/v2/models/x/nonesuch", b"{}")  # a model named x/nonesuch takes only GET
    assert status == 405 and set(body) == {"error"}
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(server.http_url + "/v2/models/x/nonesuch", timeout=60)
    assert missing.value.code == 404 and "the model 'x/nonesuch' does not exist here" in json.loads(
        missing.value.read())["error"]


def test_requests_are_counted_under_the_route(server, client):
    key = 'attnserve_requests_total{code="200",method="/v2/models/{name}/infer",protocol="http"}'
    before = server.metrics().get(key, 0)
    client.infer(MODEL, [text_input(["counted"], True)])
    assert server.metrics()[key] == before + 1
