"""KServe v2 over gRPC (inference.GRPCInferenceService) on a real `attnserve serve`, called by Triton's own client
(tritonclient.grpc) and, for what it never sends (typed contents, broken framing), by its generated stub; vectors
checked against the offline engine, a reranker's scores against sentence-transformers' CrossEncoder."""

from __future__ import annotations

import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from attnserve.v1 import encoder_pb2 as pb
from tests.conftest import GUARD_KEY, VARIED_TEXTS
from tests.serving import ServerProcess
from tests.test_server_load import arrival_order_padding, mixed_texts

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
TEXTS = [t for t in VARIED_TEXTS if len(t) < 200]
LONG = "The beginning of a long text. " + "filler words " * 150 + "and its very different ending!"


@pytest.fixture(scope="module")
def client(server):
    client = triton.InferenceServerClient(server.target)
    yield client
    client.close()


@pytest.fixture(scope="module")
def raw_stub(server):
    """Triton's generated stub, for requests tritonclient never builds."""
    with server.channel() as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def text_input(texts: list[str], shape: tuple[int, ...] | None = None, name: str = "text") -> triton.InferInput:
    array = np.array([t.encode() for t in texts], dtype=np.object_)
    if shape is not None:
        array = array.reshape(shape)
    tensor = triton.InferInput(name, list(array.shape), "BYTES")
    tensor.set_data_from_numpy(array)
    return tensor


def outputs(*names: str) -> list[triton.InferRequestedOutput]:
    return [triton.InferRequestedOutput(name) for name in names]


def raw_bytes(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def test_server_and_model_are_described(client):
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "attnserve"
    assert metadata["extensions"] == ["model_configuration", "model_repository", "statistics"]
    assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "1")
    assert not client.is_model_ready("nope") and not client.is_model_ready(MODEL, "2")
    model = client.get_model_metadata(MODEL, as_json=True)
    assert model["name"] == MODEL and model["versions"] == ["1"] and model["platform"] == "attnserve_onnxruntime"
    assert model["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1"]}]
    assert model["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": ["-1", "384"]},
                                {"name": "num_tokens", "datatype": "INT32", "shape": ["-1"]},
                                {"name": "token_embeddings", "datatype": "FP32", "shape": ["-1", "-1", "384"]}]
    config = client.get_model_config(MODEL).config
    assert config.name == MODEL and config.max_batch_size == 0 and config.backend == "attnserve"
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("text", 13, [-1])]  # TYPE_STRING
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("embedding", 11, [-1, 384]), ("num_tokens", 8, [-1]), ("token_embeddings", 11, [-1, -1, 384])]
    assert config.parameters["max_seq_length"].string_value == "256"
    index = client.get_model_repository_index(as_json=True)
    assert index == {"models": [{"name": MODEL, "version": "1", "state": "READY"}]}


def test_infer_equals_the_offline_engine(client, engine):
    reply = client.infer(MODEL, [text_input(TEXTS)], outputs=outputs("embedding", "num_tokens"), request_id="req-7")
    expected = engine.encode(TEXTS)
    np.testing.assert_allclose(reply.as_numpy("embedding"), expected.embeddings, atol=1e-5)
    assert reply.as_numpy("embedding").dtype == np.float32
    np.testing.assert_array_equal(reply.as_numpy("num_tokens"), [len(x) for x in engine.tokenizer.encode_texts(TEXTS)])
    response = reply.get_response()
    assert response.id == "req-7" and response.model_version == "1" and response.model_name == MODEL
    # No outputs named: the usual ones, not the token embeddings; an [N, 1] shape as tritonclient users send.
    default = client.infer(MODEL, [text_input(TEXTS[:4], (4, 1))])
    assert [o.name for o in default.get_response().outputs] == ["embedding", "num_tokens"]
    np.testing.assert_allclose(default.as_numpy("embedding"), expected.embeddings[:4], atol=1e-5)


def test_typed_contents_as_kserve_clients_send_them(raw_stub, engine):
    request = service_pb2.ModelInferRequest(model_name=MODEL, inputs=[service_pb2.ModelInferRequest.InferInputTensor(
        name="text", datatype="BYTES", shape=[3], contents=service_pb2.InferTensorContents(
            bytes_contents=[t.encode() for t in TEXTS[:3]]))])
    reply = raw_stub.ModelInfer(request, timeout=60)
    assert [(o.name, o.datatype, list(o.shape)) for o in reply.outputs] == [
        ("embedding", "FP32", [3, 384]), ("num_tokens", "INT32", [3])]
    embedding = np.frombuffer(reply.raw_output_contents[0], dtype="<f4").reshape(3, 384)
    np.testing.assert_allclose(embedding, engine.encode(TEXTS[:3]).embeddings, atol=1e-5)


def test_parameters_and_token_embeddings(client, stub, engine):
    with pytest.raises(InferenceServerException) as refused:
        client.infer(MODEL, [text_input([LONG])], parameters={"truncate": False})
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "longer than max_seq_length 256" in refused.value.message()
    assert "set the request parameter truncate (bool_param: true)" in refused.value.message()
    cut = client.infer(MODEL, [text_input([LONG])], parameters={"truncate": True})
    assert cut.as_numpy("num_tokens").tolist() == [256]
    np.testing.assert_allclose(cut.as_numpy("embedding"), engine.encode([LONG]).embeddings, atol=1e-5)
    raw = client.infer(MODEL, [text_input(TEXTS[:3])], parameters={"normalize": False})
    np.testing.assert_allclose(raw.as_numpy("embedding"), engine.encode(TEXTS[:3], normalize=False).embeddings,
                               atol=1e-5)
    short = client.infer(MODEL, [text_input(TEXTS[:3])], parameters={"dimensions": 64}).as_numpy("embedding")
    first = engine.encode(TEXTS[:3], normalize=False).embeddings[:, :64]
    np.testing.assert_allclose(short, first / np.linalg.norm(first, axis=1, keepdims=True), atol=1e-5)
    # token_embeddings, padded, with num_tokens saying how many rows are each text's: attnserve.v1's own.
    texts = ["a short one", TEXTS[1]]
    reply = client.infer(MODEL, [text_input(texts)], outputs=outputs("token_embeddings", "num_tokens"))
    padded, counts = reply.as_numpy("token_embeddings"), reply.as_numpy("num_tokens")
    own = stub.Embed(pb.EmbedRequest(inputs=[pb.Input(text=t) for t in texts], return_token_embeddings=True),
                     timeout=60)
    assert padded.shape == (2, counts.max(), 384)
    for row, count, embedding in zip(padded, counts, own.embeddings, strict=True):
        tokens = embedding.token_embeddings
        expected = np.frombuffer(tokens.data, "<f4").reshape(tuple(tokens.shape))
        np.testing.assert_allclose(row[:count], expected, atol=1e-5)
        assert not row[count:].any()


def test_async_infer_with_64_requests_in_flight(client, engine):
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
        client.async_infer(MODEL, [text_input([text])], callback(i), outputs=outputs("embedding"),
                           parameters={"truncate": True})
    assert finished.wait(120)
    expected = engine.encode(texts, truncate=True).embeddings
    for i in range(64):
        assert not isinstance(done[i], Exception), done[i]
        np.testing.assert_allclose(done[i].as_numpy("embedding")[0], expected[i], atol=1e-5)


@pytest.mark.parametrize("call, code, message", [
    (lambda c: c.infer("nope", [text_input(["a"])]), "NOT_FOUND", "the model 'nope' does not exist here"),
    (lambda c: c.infer(MODEL, [text_input(["a"])], model_version="2"), "NOT_FOUND", "has no version '2'"),
    (lambda c: c.infer(MODEL, [text_input([""])]), "INVALID_ARGUMENT", "input 0: empty text"),
    (lambda c: c.infer(MODEL, [text_input(["a"])], outputs=outputs("logits")), "INVALID_ARGUMENT",
     "outputs[0].name: no output 'logits'; the outputs are embedding, num_tokens, token_embeddings"),
    (lambda c: c.infer(MODEL, [text_input(["a"])], parameters={"truncate": "yes"}), "INVALID_ARGUMENT",
     "parameters.truncate: must be a boolean, got 'yes'"),
    (lambda c: c.infer(MODEL, [text_input(["a", "b"], (1, 2))]), "INVALID_ARGUMENT",
     "inputs[0].shape: 'text' is [N] or [N, 1], got [1, 2]"),
    (lambda c: c.infer(MODEL, [text_input(["a"])], parameters={"dimensions": 8.0}), "INVALID_ARGUMENT",
     "parameters.dimensions: must be an integer, written without a fraction or exponent: 8, not 8.0"),
    (lambda c: c.infer(MODEL, [text_input(["a"], name="input_ids")]), "INVALID_ARGUMENT",
     "inputs[0].name: sentence-transformers/all-MiniLM-L6-v2 takes 'text', not 'input_ids'"),
    (lambda c: c.get_model_metadata("nope"), "NOT_FOUND", "the model 'nope' does not exist here"),
    (lambda c: c.get_model_config(MODEL, "3"), "NOT_FOUND", "has no version '3'"),
    (lambda c: c.get_inference_statistics("nope"), "NOT_FOUND", "the model 'nope' does not exist here"),
], ids=["model", "version", "empty", "output", "parameter", "shape", "float-integer", "input-name", "metadata",
        "config", "statistics"])
def test_triton_client_errors_are_typed(client, call, code, message):
    with pytest.raises(InferenceServerException) as error:
        call(client)
    assert error.value.status() == f"StatusCode.{code}" and message in error.value.message(), error.value
    assert client.is_server_ready()


def _tensor(datatype="BYTES", shape=(1,), contents=None, name="text"):
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)
    if contents is not None:
        tensor.contents.CopyFrom(contents)
    return tensor


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
def test_hostile_tensors_are_invalid_argument_naming_the_tensor(raw_stub, inputs, raw, message):
    request = service_pb2.ModelInferRequest(model_name=MODEL, inputs=inputs, raw_input_contents=raw)
    with pytest.raises(grpc.RpcError) as error:
        raw_stub.ModelInfer(request, timeout=60)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in error.value.details(), (
        error.value.details())


def _stats(client) -> dict:
    (stats,) = client.get_inference_statistics(MODEL, as_json=True)["model_stats"]
    return stats


def _count(stats: dict, name: str) -> int:
    return int(stats["inference_stats"].get(name, {}).get("count", 0))


def test_statistics_count_what_the_server_measured(server, client):
    """Triton's statistics, as perf_analyzer reads them: each counter moves with the requests sent, and agrees
    with the server's Prometheus metrics, which the same measurements feed."""
    before = _stats(client)
    texts = mixed_texts(12, seed=9)
    for i in range(0, 12, 3):
        client.infer(MODEL, [text_input(texts[i:i + 3])], parameters={"truncate": True})
    with pytest.raises(InferenceServerException):
        client.infer(MODEL, [text_input([""])])  # found and admitted, then refused: a failure
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
    model = f'model="{MODEL}"'
    assert metrics[f"attnserve_queue_duration_seconds_count{{{model}}}"] == _count(after, "queue")
    assert sum(v for k, v in metrics.items() if k.startswith("attnserve_batch_size_count{")) == int(
        after["execution_count"])
    assert sum(v for k, v in metrics.items() if k.startswith("attnserve_batch_size_sum{")) == int(
        after["inference_count"])
    # Over HTTP, the same counters: tritonclient.http reads them as perf_analyzer does.
    import tritonclient.http as triton_http

    http = triton_http.InferenceServerClient(server.http_url.removeprefix("http://"))
    (over_http,) = http.get_inference_statistics(MODEL)["model_stats"]
    assert over_http["inference_count"] == int(after["inference_count"])
    assert over_http["inference_stats"]["success"]["count"] == _count(after, "success")
    assert [s["name"] for s in http.get_inference_statistics()["model_stats"]] == [MODEL]
    http.close()


def test_every_refused_infer_to_a_found_model_counts_one_failure_on_both_doors(server, client, raw_stub):
    """A request that reached the model is counted however it is refused: a bad datatype, a shape that lies, raw
    framing, an unknown output (refused while its tensors are read), an empty text (refused by the core), once each."""
    import httpx

    refused_grpc = [
        service_pb2.ModelInferRequest(model_name=MODEL, inputs=[_tensor(datatype="FP32")]),
        service_pb2.ModelInferRequest(model_name=MODEL, inputs=[_tensor(shape=[3])], raw_input_contents=[
            raw_bytes(b"a")]),
        service_pb2.ModelInferRequest(model_name=MODEL, inputs=[_tensor()], raw_input_contents=[
            raw_bytes(b"a"), raw_bytes(b"b")]),
        service_pb2.ModelInferRequest(model_name=MODEL, inputs=[_tensor()], raw_input_contents=[raw_bytes(b"a")],
                                      outputs=[service_pb2.ModelInferRequest.InferRequestedOutputTensor(
                                          name="nope")]),
        service_pb2.ModelInferRequest(model_name=MODEL, inputs=[_tensor()], raw_input_contents=[raw_bytes(b"")]),
    ]
    url = f"{server.http_url}/v2/models/{MODEL}/infer"
    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}
    refused_http = [
        (url, {"inputs": [{**text, "datatype": "FP32"}]}, {}),
        (url, {"inputs": [{**text, "shape": [3]}]}, {}),
        (url, {"inputs": [{**text, "data": None, "parameters": {"binary_data_size": 9}}]},
         {"Inference-Header-Content-Length": "400"}),
        (url, {"inputs": [text], "outputs": [{"name": "nope"}]}, {}),
        (url, {"inputs": [{**text, "data": [""]}]}, {}),
    ]
    before = _stats(client)
    for request in refused_grpc:
        with pytest.raises(grpc.RpcError) as error:
            raw_stub.ModelInfer(request, timeout=60)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
    for address, body, headers in refused_http:
        reply = httpx.post(address, json=body, headers=headers, timeout=60)
        assert reply.status_code == 400, reply.text
    unknown = httpx.post(f"{server.http_url}/v2/models/nope/infer", json={"inputs": [text]}, timeout=60)
    assert unknown.status_code == 404  # no model reached: counted nowhere
    client.infer(MODEL, [text_input(["fine"])])
    after = _stats(client)
    assert _count(after, "fail") - _count(before, "fail") == len(refused_grpc) + len(refused_http)
    assert _count(after, "success") - _count(before, "success") == 1  # one count per request, not two


def test_calls_are_counted_under_kserve_grpc(server, client):
    key = 'attnserve_requests_total{code="OK",method="ModelInfer",protocol="kserve-grpc"}'
    before = server.metrics().get(key, 0)
    client.infer(MODEL, [text_input(["counted"])])
    assert server.metrics()[key] == before + 1


def test_one_infer_of_500_mixed_texts_is_batched_by_length(server, client, engine):
    """The point of serving v2 from attnserve: Triton batches only equal shapes; here 500 texts of mixed length
    are sorted into batches of like length, as the offline engine does."""
    texts = mixed_texts(500, seed=11)
    before = server.metrics()
    reply = client.infer(MODEL, [text_input(texts)], parameters={"truncate": True})
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


def test_api_keys_guard_infer_and_not_the_probes(guarded_server):
    client = triton.InferenceServerClient(guarded_server.target)
    assert client.is_server_live() and client.is_server_ready()
    with pytest.raises(InferenceServerException) as refused:
        client.infer(MODEL, [text_input(["a"])])
    assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
    reply = client.infer(MODEL, [text_input(["a"])], headers={"authorization": f"Bearer {GUARD_KEY}"})
    assert reply.as_numpy("embedding").shape == (1, 384)
    client.close()


def test_drain_turns_server_ready_false_and_answers_every_accepted_infer(artifacts, tmp_path):
    server = ServerProcess(artifacts, log_path=tmp_path / "server.log")
    server.wait_serving()
    texts = mixed_texts(64, seed=3)
    answers: dict[int, list[str]] = {i: [] for i in range(8)}
    ready: list[bool] = []
    stop = threading.Event()

    def infer_client(i):
        client = triton.InferenceServerClient(server.target)
        while not stop.is_set():
            try:
                reply = client.infer(MODEL, [text_input(texts[i * 8:(i + 1) * 8])], parameters={"truncate": True})
                assert reply.as_numpy("embedding").shape == (8, 384)
                code = "OK"
            except InferenceServerException as e:
                code = e.status()
            answers[i].append(code)
            if code != "OK":
                break
        client.close()

    def ready_poller():
        client = triton.InferenceServerClient(server.target)
        try:
            while server.process.poll() is None:
                ready.append(client.is_server_ready())
                time.sleep(0.02)
        except InferenceServerException:
            pass  # the port closed: the process is stopping
        client.close()

    with ThreadPoolExecutor(9) as pool:
        poller = pool.submit(ready_poller)
        clients = [pool.submit(infer_client, i) for i in range(8)]
        time.sleep(2.0)
        returncode = server.terminate()
        stop.set()
        for c in clients:
            c.result()
        poller.result()
    assert returncode == 0, server.log_tail()
    for i, sequence in answers.items():  # in flight at SIGTERM: answered; after it: UNAVAILABLE; nothing lost
        assert len(sequence) >= 2 and set(sequence[:-1]) == {"OK"}, (i, sequence)
        assert sequence[-1] in ("OK", "StatusCode.UNAVAILABLE"), (i, sequence)
    assert ready[0] is True and False in ready, ready  # ServerReady turned false during the drain
    assert ready[ready.index(False):] == [False] * (len(ready) - ready.index(False))


# --- a reranker over v2, on both protocols -------------------------------------------------------------------

QUERY = "what do cats eat"
DOCUMENTS = ["Cats are obligate carnivores and eat meat.", "The stock market fell on Monday.", "Kittens drink milk.",
             "a", "Ünïcödé naïve café 東京は日本の首都です。"]


@pytest.fixture(scope="module")
def cross_encoder_scores(cross_encoder_dir):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(cross_encoder_dir), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])


def rerank_inputs(module, documents=DOCUMENTS, query=(QUERY,)):
    tensors = []
    for name, values in (("query", query), ("text", documents)):
        tensor = module.InferInput(name, [len(values)], "BYTES")
        tensor.set_data_from_numpy(np.array([v.encode() for v in values], dtype=np.object_))
        tensors.append(tensor)
    return tensors


def test_a_reranker_over_grpc_equals_cross_encoder(reranker_server, cross_encoder_scores):
    client = triton.InferenceServerClient(reranker_server.target)
    model = client.get_model_repository_index(as_json=True)["models"][0]["name"]
    metadata = client.get_model_metadata(model, as_json=True)
    assert [(t["name"], t["shape"]) for t in metadata["inputs"]] == [("query", ["1"]), ("text", ["-1"])]
    assert [(t["name"], t["datatype"]) for t in metadata["outputs"]] == [("score", "FP32")]
    scores = client.infer(model, rerank_inputs(triton)).as_numpy("score")
    assert scores.shape == (len(DOCUMENTS),)
    np.testing.assert_allclose(scores, cross_encoder_scores, atol=1e-5)  # in the order sent, not sorted
    with pytest.raises(InferenceServerException) as error:
        client.infer(model, rerank_inputs(triton, query=("a", "b")))
    assert "inputs[0].shape: 'query' is [1] or [1, 1], got [2]" in error.value.message()
    with pytest.raises(InferenceServerException) as error:
        client.infer(model, rerank_inputs(triton)[1:])
    assert "'query' is missing" in error.value.message()
    client.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_a_reranker_over_http_equals_cross_encoder(reranker_server, cross_encoder_scores, binary):
    import tritonclient.http as triton_http

    client = triton_http.InferenceServerClient(reranker_server.http_url.removeprefix("http://"))
    model = client.get_model_repository_index()[0]["name"]
    inputs = rerank_inputs(triton_http)
    for tensor, values in zip(inputs, ((QUERY,), DOCUMENTS), strict=True):
        tensor.set_data_from_numpy(np.array([v.encode() for v in values], dtype=np.object_), binary_data=binary)
    reply = client.infer(model, inputs, outputs=[triton_http.InferRequestedOutput("score", binary_data=binary)])
    np.testing.assert_allclose(reply.as_numpy("score"), cross_encoder_scores, atol=1e-5)
    client.close()
