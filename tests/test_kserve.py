"""KServe v2 over HTTP and gRPC on a real `attnserve serve`, called by Triton's own clients (tritonclient.http and
.grpc) and by hand (raw JSON, Triton's generated stub) for what they never send; vectors checked against the
offline engine, a reranker's scores against sentence-transformers' CrossEncoder."""

from __future__ import annotations

import json
import struct
import threading
import time

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from attnserve.v1 import encoder_pb2 as pb
from tests.conftest import GUARD_KEY
from tests.doors import LONG, MODEL, TEXTS
from tests.test_server_load import arrival_order_padding, mixed_texts

MODULES = {"http": triton, "grpc": triton_grpc}
STATUS = {"http": {"NOT_FOUND": "404", "INVALID_ARGUMENT": "400"},
          "grpc": {"NOT_FOUND": "StatusCode.NOT_FOUND", "INVALID_ARGUMENT": "StatusCode.INVALID_ARGUMENT"}}
INFER = f"/v2/models/{MODEL}/infer"


@pytest.fixture(scope="module")
def clients(server):
    """protocol -> tritonclient's client of the shared server (MODEL has a slash, which tritonclient does not
    escape)."""
    pair = {"http": triton.InferenceServerClient(server.http_url.removeprefix("http://"), network_timeout=60),
            "grpc": triton_grpc.InferenceServerClient(server.target)}
    yield pair
    for client in pair.values():
        client.close()


@pytest.fixture(scope="module")
def raw_stub(server):
    """Triton's generated stub, for requests tritonclient never builds."""
    with server.channel() as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def text_input(texts: list[str], binary: bool = True, shape: tuple[int, ...] | None = None, name: str = "text",
               module=triton):
    array = np.array([t.encode() for t in texts], dtype=np.object_)
    if shape is not None:
        array = array.reshape(shape)
    tensor = module.InferInput(name, list(array.shape), "BYTES")
    tensor.set_data_from_numpy(array, **({"binary_data": binary} if module is triton else {}))
    return tensor


def outputs(module, binary: bool, *names: str) -> list:
    return [module.InferRequestedOutput(n, **({"binary_data": binary} if module is triton else {})) for n in names]


def as_json(protocol: str, client, call: str, *args):
    """A description's JSON, as tritonclient.http reads it or tritonclient.grpc's as_json gives it (the protobuf
    JSON mapping: int64s as strings, default values left out)."""
    return getattr(client, call)(*args, **({"as_json": True} if protocol == "grpc" else {}))


def response(reply) -> dict:
    from google.protobuf.json_format import MessageToDict

    got = reply.get_response()
    return got if isinstance(got, dict) else MessageToDict(got, preserving_proto_field_name=True)


def dims(tensors: list[dict], key: str) -> list[dict]:
    return [{**t, key: [int(d) for d in t[key]]} for t in tensors]


@pytest.mark.parametrize("protocol", MODULES)
def test_server_and_model_are_described(clients, protocol):
    """Metadata, and Triton's model_configuration and model_repository extensions as perf_analyzer reads them."""
    client = clients[protocol]
    assert client.is_server_live() and client.is_server_ready()
    metadata = as_json(protocol, client, "get_server_metadata")
    assert metadata["name"] == "attnserve"
    assert metadata["extensions"] == [*(["binary_tensor_data"] if protocol == "http" else []), "model_configuration",
                                      "model_repository", "statistics"]
    assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "1")
    assert not client.is_model_ready("nope") and not client.is_model_ready(MODEL, "2")
    model = as_json(protocol, client, "get_model_metadata", MODEL)
    assert model == as_json(protocol, client, "get_model_metadata", MODEL, "1")
    assert model["name"] == MODEL and model["versions"] == ["1"] and model["platform"] == "attnserve_onnxruntime"
    assert dims(model["inputs"], "shape") == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert dims(model["outputs"], "shape") == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]},
                                               {"name": "num_tokens", "datatype": "INT32", "shape": [-1]},
                                               {"name": "token_embeddings", "datatype": "FP32", "shape": [-1, -1, 384]}]
    config = as_json(protocol, client, "get_model_config", MODEL)
    assert config == as_json(protocol, client, "get_model_config", MODEL, "1")
    config = config if protocol == "http" else config["config"]
    assert (config["name"], config["backend"]) == (MODEL, "attnserve")
    assert config["max_batch_size"] == 0 if protocol == "http" else "max_batch_size" not in config  # 0: unset
    assert dims(config["input"], "dims") == [{"name": "text", "data_type": "TYPE_STRING", "dims": [-1]}]
    assert dims(config["output"], "dims") == [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [-1, 384]},
                                              {"name": "num_tokens", "data_type": "TYPE_INT32", "dims": [-1]},
                                              {"name": "token_embeddings", "data_type": "TYPE_FP32",
                                               "dims": [-1, -1, 384]}]
    assert config["parameters"]["max_seq_length"] == {"string_value": "256"}
    index = as_json(protocol, client, "get_model_repository_index")
    assert (index if protocol == "http" else index["models"]) == [{"name": MODEL, "version": "1", "state": "READY"}]


@pytest.mark.parametrize("protocol, binary", [("http", True), ("http", False), ("grpc", True)],
                         ids=["http-binary", "http-json", "grpc"])
def test_infer_equals_the_offline_engine(clients, engine, protocol, binary):
    client, module = clients[protocol], MODULES[protocol]
    reply = client.infer(MODEL, [text_input(TEXTS, binary, module=module)],
                         outputs=outputs(module, binary, "embedding", "num_tokens"), request_id="req-7")
    expected = engine.encode(TEXTS)  # the model's own pipeline normalises
    np.testing.assert_allclose(reply.as_numpy("embedding"), expected.embeddings, atol=1e-5)
    assert reply.as_numpy("embedding").dtype == np.float32
    np.testing.assert_array_equal(reply.as_numpy("num_tokens"), [len(x) for x in engine.tokenizer.encode_texts(TEXTS)])
    assert {k: response(reply)[k] for k in ("id", "model_version", "model_name")} == {
        "id": "req-7", "model_version": "1", "model_name": MODEL}
    # No outputs named: the usual ones, not the token embeddings; an [N, 1] shape as tritonclient users send.
    default = client.infer(MODEL, [text_input(TEXTS[:4], binary, (4, 1), module=module)])
    assert [o["name"] for o in response(default)["outputs"]] == ["embedding", "num_tokens"]
    np.testing.assert_allclose(default.as_numpy("embedding"), expected.embeddings[:4], atol=1e-5)


@pytest.mark.parametrize("protocol", MODULES)
def test_parameters_and_token_embeddings(clients, stub, engine, protocol):
    client, module = clients[protocol], MODULES[protocol]
    with pytest.raises(InferenceServerException) as refused:
        client.infer(MODEL, [text_input([LONG], module=module)], parameters={"truncate": False})
    assert refused.value.status() == STATUS[protocol]["INVALID_ARGUMENT"]
    assert "longer than max_seq_length 256" in refused.value.message()
    assert {"http": 'set "parameters": {"truncate": true} in the request',
            "grpc": "set the request parameter truncate (bool_param: true)"}[protocol] in refused.value.message()
    cut = client.infer(MODEL, [text_input([LONG], module=module)], parameters={"truncate": True})
    assert cut.as_numpy("num_tokens").tolist() == [256]
    np.testing.assert_allclose(cut.as_numpy("embedding"), engine.encode([LONG]).embeddings, atol=1e-5)
    raw = client.infer(MODEL, [text_input(TEXTS[:3], module=module)], parameters={"normalize": False})
    first = engine.encode(TEXTS[:3], normalize=False).embeddings
    np.testing.assert_allclose(raw.as_numpy("embedding"), first, atol=1e-5)
    short = client.infer(MODEL, [text_input(TEXTS[:3], module=module)], parameters={"dimensions": 64})
    first = first[:, :64]
    np.testing.assert_allclose(short.as_numpy("embedding"), first / np.linalg.norm(first, axis=1, keepdims=True),
                               atol=1e-5)
    # token_embeddings, padded, with num_tokens saying how many rows are each text's: attnserve.v1's own.
    texts = ["a short one", TEXTS[1]]
    reply = client.infer(MODEL, [text_input(texts, module=module)],
                         outputs=outputs(module, True, "token_embeddings", "num_tokens"))
    padded, counts = reply.as_numpy("token_embeddings"), reply.as_numpy("num_tokens")
    own = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=t) for t in texts], return_token_embeddings=True),
                     timeout=60)
    assert padded.shape == (2, counts.max(), 384)
    for row, count, embedding in zip(padded, counts, own.embeddings, strict=True):
        tokens = embedding.token_embeddings
        np.testing.assert_allclose(row[:count], np.frombuffer(tokens.data, "<f4").reshape(tuple(tokens.shape)),
                                   atol=1e-5)
        assert not row[count:].any()


@pytest.mark.parametrize("protocol", MODULES)
@pytest.mark.parametrize("call, code, message", [
    (lambda c, m: c.infer("nope", [text_input(["a"], module=m)]), "NOT_FOUND", "the model 'nope' does not exist here"),
    (lambda c, m: c.infer(MODEL, [text_input(["a"], module=m)], model_version="2"), "NOT_FOUND", "has no version '2'"),
    (lambda c, m: c.infer(MODEL, [text_input([""], module=m)]), "INVALID_ARGUMENT", "input 0: empty text"),
    (lambda c, m: c.infer(MODEL, [text_input(["a"], module=m)], outputs=outputs(m, True, "logits")),
     "INVALID_ARGUMENT",
     "outputs[0].name: no output 'logits'; the outputs are embedding, num_tokens, token_embeddings"),
    (lambda c, m: c.infer(MODEL, [text_input(["a"], module=m)], parameters={"truncate": "yes"}), "INVALID_ARGUMENT",
     "parameters.truncate: must be a boolean, got 'yes'"),
    (lambda c, m: c.infer(MODEL, [text_input(["a", "b"], True, (1, 2), module=m)]), "INVALID_ARGUMENT",
     "inputs[0].shape: 'text' is [N] or [N, 1], got [1, 2]"),
    (lambda c, m: c.infer(MODEL, [text_input(["a"], module=m)], parameters={"dimensions": 8.0}), "INVALID_ARGUMENT",
     "parameters.dimensions: must be an integer, written without a fraction or exponent: 8, not 8.0"),
    (lambda c, m: c.infer(MODEL, [text_input(["a"], name="input_ids", module=m)]), "INVALID_ARGUMENT",
     "inputs[0].name: sentence-transformers/all-MiniLM-L6-v2 takes 'text', not 'input_ids'"),
    (lambda c, m: c.get_model_metadata("nope"), "NOT_FOUND", "the model 'nope' does not exist here"),
    (lambda c, m: c.get_model_config(MODEL, "3"), "NOT_FOUND", "has no version '3'"),
    (lambda c, m: c.get_inference_statistics("nope"), "NOT_FOUND", "the model 'nope' does not exist here"),
], ids=["model", "version", "empty", "output", "parameter", "shape", "float-integer", "input-name", "metadata",
        "config", "statistics"])
def test_triton_client_errors_are_typed(clients, protocol, call, code, message):
    with pytest.raises(InferenceServerException) as error:
        call(clients[protocol], MODULES[protocol])
    assert error.value.status() == STATUS[protocol][code] and message in error.value.message(), error.value
    assert clients[protocol].is_server_ready()


def raw_bytes(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def _tensor(datatype="BYTES", shape=(1,), contents=None, name="text"):
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)
    if contents is not None:
        tensor.contents.CopyFrom(contents)
    return tensor


def test_typed_contents_as_kserve_clients_send_them(raw_stub, engine):
    contents = service_pb2.InferTensorContents(bytes_contents=[t.encode() for t in TEXTS[:3]])
    reply = raw_stub.ModelInfer(service_pb2.ModelInferRequest(
        model_name=MODEL, inputs=[_tensor(shape=[3], contents=contents)]), timeout=60)
    assert [(o.name, o.datatype, list(o.shape)) for o in reply.outputs] == [
        ("embedding", "FP32", [3, 384]), ("num_tokens", "INT32", [3])]
    embedding = np.frombuffer(reply.raw_output_contents[0], dtype="<f4").reshape(3, 384)
    np.testing.assert_allclose(embedding, engine.encode(TEXTS[:3]).embeddings, atol=1e-5)


@pytest.mark.parametrize("inputs, raw, message", [
    ([_tensor(shape=[2])], [raw_bytes(b"abcd")], "inputs[0]: element 1's length runs past the tensor's bytes"),
    ([_tensor()], [struct.pack("<I", 99) + b"a"], "inputs[0]: element 0 is 99 bytes, past the tensor's bytes"),
    ([_tensor()], [raw_bytes(b"ab") + b"x"], "inputs[0]: 1 bytes follow the tensor's 1 elements"),
    ([_tensor(shape=[10 ** 12])], [raw_bytes(b"abcd")], "shape holds 1000000000000 elements, but 8 bytes cannot"),
    ([_tensor()], [raw_bytes(b"\xff\xfe")], "inputs[0].data[0]: not UTF-8 text"),
    ([_tensor(datatype="FP32")], [b"\0\0\0\0"], "inputs[0].datatype: 'text' is BYTES (texts), not 'FP32'"),
    ([_tensor()], [], "inputs[0]: give 'text''s elements once"),
    ([_tensor(), _tensor(name="other")], [raw_bytes(b"a")], "raw_input_contents: 1 entries for 2 inputs"),
    ([_tensor(contents=service_pb2.InferTensorContents(bytes_contents=[b"a"]))], [raw_bytes(b"a")],
     "give every input's elements in raw_input_contents or every input's in contents, not both"),
    ([_tensor(shape=[2], contents=service_pb2.InferTensorContents(bytes_contents=[b"a"]))], [],
     "inputs[0].data: shape [2] holds 2 elements, the data has 1"),
    ([], [], "inputs: sentence-transformers/all-MiniLM-L6-v2 takes 'text' (BYTES); 'text' is missing"),
    ([_tensor(), _tensor()], [raw_bytes(b"a"), raw_bytes(b"b")], "inputs[1]: the input 'text' is given twice"),
], ids=["count", "element-overrun", "trailing", "huge-shape", "utf8", "datatype", "no-data", "raw-count", "both",
        "typed-count", "missing", "twice"])
def test_hostile_grpc_tensors_are_invalid_argument_naming_the_tensor(raw_stub, inputs, raw, message):
    request = service_pb2.ModelInferRequest(model_name=MODEL, inputs=inputs, raw_input_contents=raw)
    with pytest.raises(grpc.RpcError) as error:
        raw_stub.ModelInfer(request, timeout=60)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in error.value.details(), (
        error.value.details())


def post(server, path: str, body: bytes, headers: dict | None = None) -> httpx.Response:
    return httpx.post(server.http_url + path, content=body, headers={"Content-Type": "application/json",
                                                                    **(headers or {})}, timeout=60)


def infer_body(tensor: dict, **extra) -> bytes:
    return json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", **tensor}], **extra}).encode()


@pytest.mark.parametrize("tensor, tail, header_extra, message", [
    ({"shape": [2], "data": ["a"]}, b"", 0, "inputs[0].data: shape [2] holds 2 elements, the data has 1"),
    ({"shape": [1], "data": [5]}, b"", 0, "inputs[0].data[0]: must be a string, got int"),
    ({"shape": [1], "datatype": "FP32", "data": [1.0]}, b"", 0, "inputs[0].datatype: 'text' is BYTES"),
    ({"shape": [10 ** 12], "parameters": {"binary_data_size": 8}}, raw_bytes(b"abcd"), 0,
     "inputs[0]: shape holds 1000000000000 elements, but 8 bytes cannot"),
    ({"shape": [1], "parameters": {"binary_data_size": 5}}, struct.pack("<I", 99) + b"a", 0,
     "inputs[0]: element 0 is 99 bytes, past the tensor's bytes"),
    ({"shape": [1], "parameters": {"binary_data_size": 6}}, raw_bytes(b"\xff\xfe"), 0,
     "inputs[0].data[0]: not UTF-8 text"),
    ({"shape": [1], "parameters": {"binary_data_size": 7}}, raw_bytes(b"ab") + b"x", 0,
     "inputs[0]: 1 bytes follow the tensor's 1 elements"),
    ({"shape": [1], "parameters": {"binary_data_size": 50}}, raw_bytes(b"ab"), 0,
     "binary_data_size is 50, but only 6 bytes follow the JSON"),
    ({"shape": [1], "parameters": {"binary_data_size": 6}}, raw_bytes(b"ab"), 100, "but the body holds"),
    ({"shape": [1]}, b"", 0, "give 'text''s elements once, either typed (data, contents) or as raw bytes"),
    ({"shape": [1.0], "data": ["a"]}, b"", 0,
     "inputs[0].shape[0]: must be an integer, written without a fraction or exponent: 1, not 1.0"),
], ids=["count", "element-type", "datatype", "huge-shape", "element-overrun", "utf8", "trailing", "size-overrun",
        "header-overrun", "no-data", "float-shape"])
def test_hostile_http_tensors_get_a_clear_400(server, tensor, tail, header_extra, message):
    header = infer_body({"datatype": "BYTES", **tensor})
    reply = post(server, INFER, header + tail, {"Inference-Header-Content-Length": str(len(header) + header_extra)})
    assert reply.status_code == 400 and set(reply.json()) == {"error"} and message in reply.json()["error"], reply.text


def test_http_by_hand_binary_tensors_other_inputs_header_lengths_and_routes(server, engine):
    header = infer_body({"shape": [2], "parameters": {"binary_data_size": 14}})
    reply = post(server, f"/v2/models/{MODEL}/versions/1/infer", header + raw_bytes(b"hello", b"a"),
                 {"Inference-Header-Content-Length": str(len(header))})
    assert reply.status_code == 200
    embedding = next(o for o in reply.json()["outputs"] if o["name"] == "embedding")
    assert embedding["shape"] == [2, 384]
    np.testing.assert_allclose(np.array(embedding["data"], np.float32).reshape(2, 384),
                               engine.encode(["hello", "a"]).embeddings, atol=1e-5)
    # An empty list of outputs is no list, as in KServe's protobuf form: every output.
    reply = post(server, INFER, infer_body({"shape": [1], "data": ["a"]}, outputs=[]))
    assert reply.status_code == 200 and [o["name"] for o in reply.json()["outputs"]] == ["embedding", "num_tokens"]
    other = json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1], "data": [1]}]})
    reply = post(server, INFER, other.encode())
    assert reply.status_code == 400 and "takes 'text', not 'input_ids'" in reply.json()["error"]
    for length in ("²", "-1", "abc"):  # "²" passes str.isdigit() and fails int()
        reply = post(server, INFER, b"{}", {"Inference-Header-Content-Length": length.encode("latin-1")})
        assert reply.status_code == 400 and "is not a byte count" in reply.json()["error"], (length, reply.text)
    index = post(server, "/v2/repository/index", b'{"ready": true}')
    assert index.status_code == 200 and index.json() == [{"name": MODEL, "version": "1", "state": "READY"}]
    index = post(server, "/v2/repository/index", b'{"ready": "yes"}')
    assert index.status_code == 400 and "ready" in index.json()["error"]
    for path in (f"/v2/models/{MODEL}/config", "/v2/models/x/nonesuch"):  # read with GET (a model named x/nonesuch)
        reply = post(server, path, b"{}")
        assert reply.status_code == 405 and set(reply.json()) == {"error"}, path
    missing = httpx.get(server.http_url + "/v2/models/x/nonesuch", timeout=60)
    assert missing.status_code == 404 and "the model 'x/nonesuch' does not exist here" in missing.json()["error"]


@pytest.mark.parametrize("protocol, key", [
    ("http", 'attnserve_requests_total{code="200",method="/v2/models/{name}/infer",protocol="http"}'),
    ("grpc", 'attnserve_requests_total{code="OK",method="ModelInfer",protocol="kserve-grpc"}')])
def test_requests_are_counted_under_the_route_or_method(server, clients, protocol, key):
    before = server.metrics().get(key, 0)
    clients[protocol].infer(MODEL, [text_input(["counted"], module=MODULES[protocol])])
    assert server.metrics()[key] == before + 1


def test_async_infer_with_64_requests_in_flight(clients, engine):
    texts = mixed_texts(64, seed=5)
    done: dict[int, object] = {}
    finished = threading.Event()

    def callback(i):
        def record(result, error):
            done[i] = error if error is not None else result
            if len(done) == 64:
                finished.set()
        return record

    for i, text in enumerate(texts):
        clients["grpc"].async_infer(MODEL, [text_input([text], module=triton_grpc)], callback(i),
                                    outputs=outputs(triton_grpc, True, "embedding"), parameters={"truncate": True})
    assert finished.wait(120)
    expected = engine.encode(texts, truncate=True).embeddings
    for i in range(64):
        assert not isinstance(done[i], Exception), done[i]
        np.testing.assert_allclose(done[i].as_numpy("embedding")[0], expected[i], atol=1e-5)


def _stats(client) -> dict:
    (stats,) = client.get_inference_statistics(MODEL, as_json=True)["model_stats"]
    return stats


def _count(stats: dict, name: str) -> int:
    return int(stats["inference_stats"].get(name, {}).get("count", 0))


def test_statistics_count_what_the_server_measured(server, clients):
    """Triton's statistics, as perf_analyzer reads them: each counter moves with the requests sent, and agrees
    with the server's Prometheus metrics, which the same measurements feed."""
    client = clients["grpc"]
    before = _stats(client)
    texts = mixed_texts(12, seed=9)
    for i in range(0, 12, 3):
        client.infer(MODEL, [text_input(texts[i:i + 3], module=triton_grpc)], parameters={"truncate": True})
    with pytest.raises(InferenceServerException):
        client.infer(MODEL, [text_input([""], module=triton_grpc)])  # found and admitted, then refused: a failure
    after, metrics = _stats(client), server.metrics()
    assert after["name"] == MODEL and after["version"] == "1"
    assert _count(after, "success") - _count(before, "success") == 4
    assert _count(after, "fail") - _count(before, "fail") == 1
    for name in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert _count(after, name) - _count(before, name) == 12, name  # per input
    assert int(after["inference_count"]) - int(before.get("inference_count", 0)) == 12
    assert int(after["execution_count"]) > int(before.get("execution_count", 0))
    for name in ("success", "queue", "compute_infer"):
        assert int(after["inference_stats"][name]["ns"]) > int(before["inference_stats"].get(name, {}).get("ns", 0))
    assert abs(int(after["last_inference"]) / 1e3 - time.time()) < 60
    assert _count(after, "cache_hit") == _count(after, "cache_miss") == 0  # no response cache
    # Per batch size: the batches add up to the executions and the inputs to the inference count.
    batches = after["batch_stats"]
    assert sum(int(b["compute_infer"]["count"]) for b in batches) == int(after["execution_count"])
    assert sum(int(b["batch_size"]) * int(b["compute_infer"]["count"]) for b in batches) == int(
        after["inference_count"])
    # The Prometheus metrics count the same inputs and batches (warm-up runs outside the batcher: in neither).
    assert metrics[f'attnserve_queue_duration_seconds_count{{model="{MODEL}"}}'] == _count(after, "queue")
    assert sum(v for k, v in metrics.items() if k.startswith("attnserve_batch_size_count{")) == int(
        after["execution_count"])
    assert sum(v for k, v in metrics.items() if k.startswith("attnserve_batch_size_sum{")) == int(
        after["inference_count"])
    # Over HTTP, the same counters: tritonclient.http reads them as perf_analyzer does.
    (over_http,) = clients["http"].get_inference_statistics(MODEL)["model_stats"]
    assert over_http["inference_count"] == int(after["inference_count"])
    assert over_http["inference_stats"]["success"]["count"] == _count(after, "success")
    assert [s["name"] for s in clients["http"].get_inference_statistics()["model_stats"]] == [MODEL]


def test_every_refused_infer_to_a_found_model_counts_one_failure_on_both_doors(server, clients, raw_stub):
    """A request that reached the model is counted however it is refused: a bad datatype, a shape that lies, raw
    framing, an unknown output (refused while its tensors are read), an empty text (refused by the core), once each."""
    one = [raw_bytes(b"a")]
    refused_grpc = [dict(inputs=[_tensor(datatype="FP32")]), dict(inputs=[_tensor(shape=[3])], raw_input_contents=one),
                    dict(inputs=[_tensor()], raw_input_contents=[*one, raw_bytes(b"b")]),
                    dict(inputs=[_tensor()], raw_input_contents=one,
                         outputs=[service_pb2.ModelInferRequest.InferRequestedOutputTensor(name="nope")]),
                    dict(inputs=[_tensor()], raw_input_contents=[raw_bytes(b"")])]
    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}
    refused_http = [({"inputs": [{**text, "datatype": "FP32"}]}, {}), ({"inputs": [{**text, "shape": [3]}]}, {}),
                    ({"inputs": [{**text, "data": None, "parameters": {"binary_data_size": 9}}]},
                     {"Inference-Header-Content-Length": "400"}),
                    ({"inputs": [text], "outputs": [{"name": "nope"}]}, {}), ({"inputs": [{**text, "data": [""]}]}, {})]
    before = _stats(clients["grpc"])
    for fields in refused_grpc:
        with pytest.raises(grpc.RpcError) as error:
            raw_stub.ModelInfer(service_pb2.ModelInferRequest(model_name=MODEL, **fields), timeout=60)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
    for body, headers in refused_http:
        reply = httpx.post(server.http_url + INFER, json=body, headers=headers, timeout=60)
        assert reply.status_code == 400, reply.text
    unknown = httpx.post(f"{server.http_url}/v2/models/nope/infer", json={"inputs": [text]}, timeout=60)
    assert unknown.status_code == 404  # no model reached: counted nowhere
    clients["grpc"].infer(MODEL, [text_input(["fine"], module=triton_grpc)])
    after = _stats(clients["grpc"])
    assert _count(after, "fail") - _count(before, "fail") == len(refused_grpc) + len(refused_http)
    assert _count(after, "success") - _count(before, "success") == 1  # one count per request, not two


def test_one_infer_of_500_mixed_texts_is_batched_by_length(server, clients, engine):
    """The point of serving v2 from attnserve: Triton batches only equal shapes; here 500 texts of mixed length
    are sorted into batches of like length, as the offline engine does."""
    texts = mixed_texts(500, seed=11)
    before = server.metrics()
    reply = clients["grpc"].infer(MODEL, [text_input(texts, module=triton_grpc)], parameters={"truncate": True})
    after = server.metrics()
    np.testing.assert_allclose(reply.as_numpy("embedding"), engine.encode(texts, truncate=True).embeddings, atol=1e-5)

    def grew(name):  # over every label set: only this request ran
        return sum(after[k] - before.get(k, 0) for k in after if k.startswith(name + "{"))

    real, cells = grew("attnserve_batch_tokens_computed_total"), grew("attnserve_batch_cells_computed_total")
    lengths = reply.as_numpy("num_tokens")
    assert real == lengths.sum()
    # The bar, as tests/test_server_load.py's: a quarter of what batches of the same mean size taken in arrival
    # order would pad (0.74 here), from the same texts' token counts; batched by length, this pads 0.05 to 0.10.
    unsorted = arrival_order_padding(lengths, max(2, round(len(texts) / grew("attnserve_batch_size_count"))))
    assert (cells - real) / cells <= unsorted / 4, (real, cells, unsorted)


def test_api_keys_guard_grpc_infer_and_not_the_probes(guarded_server):
    client = triton_grpc.InferenceServerClient(guarded_server.target)
    assert client.is_server_live() and client.is_server_ready()
    with pytest.raises(InferenceServerException) as refused:
        client.infer(MODEL, [text_input(["a"], module=triton_grpc)])
    assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
    reply = client.infer(MODEL, [text_input(["a"], module=triton_grpc)],
                         headers={"authorization": f"Bearer {GUARD_KEY}"})
    assert reply.as_numpy("embedding").shape == (1, 384)
    client.close()


# --- a reranker over v2, on both protocols -------------------------------------------------------------------

QUERY = "what do cats eat"
DOCUMENTS = ["Cats are obligate carnivores and eat meat.", "The stock market fell on Monday.", "Kittens drink milk.",
             "a", "Ünïcödé naïve café 東京は日本の首都です。"]


@pytest.fixture(scope="module")
def cross_encoder_scores(cross_encoder_dir):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(cross_encoder_dir), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])


@pytest.mark.parametrize("protocol, binary", [("http", True), ("http", False), ("grpc", True)],
                         ids=["http-binary", "http-json", "grpc"])
def test_a_reranker_equals_cross_encoder(reranker_server, cross_encoder_scores, protocol, binary):
    """`query` [1] and `text` [N] in, `score` [N] out in the order sent, not sorted."""
    module = MODULES[protocol]
    client = (module.InferenceServerClient(reranker_server.http_url.removeprefix("http://")) if protocol == "http"
              else module.InferenceServerClient(reranker_server.target))
    index = as_json(protocol, client, "get_model_repository_index")
    model = (index if protocol == "http" else index["models"])[0]["name"]
    metadata = as_json(protocol, client, "get_model_metadata", model)
    assert [(t["name"], [int(d) for d in t["shape"]]) for t in metadata["inputs"]] == [("query", [1]), ("text", [-1])]
    assert [(t["name"], t["datatype"]) for t in metadata["outputs"]] == [("score", "FP32")]
    inputs = lambda query=(QUERY,): [text_input(list(query), binary, name="query", module=module),
                                     text_input(DOCUMENTS, binary, module=module)]
    scores = client.infer(model, inputs(), outputs=outputs(module, binary, "score")).as_numpy("score")
    assert scores.shape == (len(DOCUMENTS),)
    np.testing.assert_allclose(scores, cross_encoder_scores, atol=1e-5)
    with pytest.raises(InferenceServerException) as error:
        client.infer(model, inputs(query=("a", "b")))
    assert "inputs[0].shape: 'query' is [1] or [1, 1], got [2]" in error.value.message()
    with pytest.raises(InferenceServerException) as error:
        client.infer(model, inputs()[1:])
    assert "'query' is missing" in error.value.message()
    client.close()
