"""Several models in one real `attnserve serve` process, chosen by name on every door; prompts and `dimensions`
on every protocol and in `attnserve encode`, checked against what prepending the prompt and cutting give."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import httpx
import numpy as np
import openai
import pyarrow.parquet as pq
import pytest

from attnserve.client import Client, RequestError
from attnserve.config import ServerConfig
from attnserve.engine.manifest import load_manifest
from attnserve.errors import ConfigError
from attnserve.server.model_sources import model_sources
from attnserve.server.models import thread_share
from tests.conftest import run_cli
from tests.serving import ServerProcess, serving

TEXTS = ["The cat sat on the mat.", "Where is the nearest train station?", "a"]
PROMPTS = {"query": "query: ", "passage": "passage: "}


def artifacts_with_prompts(artifacts: Path, out: Path) -> Path:
    """The same model under another folder, its manifest keeping prompts as export writes them (pipe branch):
    the graph and tokenizer files are links to the original, the manifest a copy with the prompts added."""
    out.mkdir()
    for f in artifacts.iterdir():
        if f.name != "manifest.json":
            (out / f.name).symlink_to(f)
    manifest = json.loads((artifacts / "manifest.json").read_text())
    manifest["prompts"] = PROMPTS
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.fixture(scope="module")
def two(artifacts, tmp_path_factory):
    """mini (with prompts, the default) and other (the plain export), served together, their batches paired under
    load (--pair-batches on: each graph's second, half-width session; server/batch_pairs.py)."""
    prompted = artifacts_with_prompts(artifacts, tmp_path_factory.mktemp("models") / "mini")
    with serving(ServerProcess(None, "--model", f"mini={prompted}", "--model", f"other={artifacts}",
                               "--pair-batches", "on", env={"ATTNSERVE_THREADS": None})) as server:
        yield server


@pytest.fixture(scope="module")
def client(two):
    with Client(two.target) as c:
        yield c


def test_each_model_answers_by_name_the_default_when_unnamed_and_replies_name_it(client, two):
    """On gRPC (Embed, ListModels, GetModelInfo, health per model) and HTTP's attention route."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from attnserve.client.client import make_request

    mini, other, default = (client.embed(TEXTS, model=m) for m in ("mini", "other", None))
    np.testing.assert_allclose(mini, other, atol=1e-6)  # the same weights under two names
    np.testing.assert_array_equal(mini, default)
    models = client.list_models()
    assert [m.model for m in models] == ["mini", "other"] and list(models[0].names) == ["mini"]
    assert client.model_info("other").model == "other" and client.model_info().model == "mini"
    with two.channel() as channel:
        stub, health = two.stub(channel), health_pb2_grpc.HealthStub(channel)
        assert stub.Embed(make_request(TEXTS, model="other")).model == "other"
        assert stub.Embed(make_request(TEXTS)).model == "mini"
        for service in ("", "attnserve.v1.Encoder", "attnserve.v1.Encoder/mini", "attnserve.v1.Encoder/other"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
    reply = httpx.post(f"{two.http_url}/v1/attention", json={"inputs": "hello there", "model": "other"}, timeout=30)
    assert reply.status_code == 200 and reply.json()["model"] == "other"
    assert httpx.post(f"{two.http_url}/v1/attention", json={"inputs": "hi"}, timeout=30).json()["model"] == "mini"


def test_the_embed_command_takes_a_model_a_prompt_and_dimensions(two, client):
    result = run_cli("embed", *TEXTS[:2], "--target", two.target, "--model", "other", "--prompt", "query: ",
                     "--dimensions", "16")
    assert result.returncode == 0, result.stderr
    got = np.array([e["embedding"] for e in json.loads(result.stdout)["embeddings"]], dtype=np.float32)
    np.testing.assert_allclose(got, client.embed(["query: " + t for t in TEXTS[:2]], model="other", dimensions=16),
                               atol=1e-6)
    result = run_cli("embed", "hi", "--target", two.target, "--model", "nope")
    assert result.returncode == 1 and "NOT_FOUND" in result.stderr and "'mini', 'other'" in result.stderr


def test_an_unknown_model_is_not_found_naming_the_models_served(client, two):
    with pytest.raises(RequestError) as caught:
        client.embed(TEXTS, model="nope")
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    assert "'nope'" in caught.value.details and "'mini', 'other'" in caught.value.details
    with pytest.raises(RequestError) as caught:
        client.model_info("nope")
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    reply = httpx.post(f"{two.http_url}/v1/embeddings", json={"input": TEXTS, "model": "nope"}, timeout=30)
    assert reply.status_code == 404 and "'mini', 'other'" in reply.json()["error"]["message"]
    assert reply.json()["error"]["code"] == "model_not_found"
    reply = httpx.post(f"{two.http_url}/v1/attention", json={"inputs": "hi", "model": "nope"}, timeout=30)
    assert reply.status_code == 404


def test_the_openai_sdk_selects_by_model_and_lists_them_all(two, client):
    with openai.OpenAI(base_url=f"{two.http_url}/v1", api_key="unused", max_retries=0, timeout=60) as sdk:
        assert [m.id for m in sdk.models.list()] == ["mini", "other"]
        assert sdk.models.retrieve("other").id == "other"
        reply = sdk.embeddings.create(input=TEXTS, model="other", dimensions=64)
        assert reply.model == "other"
        got = np.array([d.embedding for d in reply.data], dtype=np.float32)
        np.testing.assert_allclose(got, client.embed(TEXTS, model="other", dimensions=64, normalize=True), atol=1e-6)
        with pytest.raises(openai.NotFoundError, match="'mini', 'other'"):
            sdk.embeddings.create(input=TEXTS, model="gpt-nope")


def test_teis_routes_serve_the_model_a_body_names_and_never_another_silently(two):
    """TEI's bodies name no model (a TEI server serves one); attnserve's `model` field picks one on every TEI route,
    and a name not served is refused on each, never answered by the default model."""
    url = two.http_url
    bodies = {"/embed": {"inputs": TEXTS}, "/embed_all": {"inputs": TEXTS}, "/tokenize": {"inputs": TEXTS},
              "/decode": {"ids": [101, 7592, 102]}, "/similarity": {"inputs": {"source_sentence": "a",
                                                                                "sentences": TEXTS}}}
    for route, body in bodies.items():
        refused = httpx.post(f"{url}{route}", json={**body, "model": "mpnet"}, timeout=30)
        assert refused.status_code == 404, (route, refused.text)
        assert "'mpnet'" in refused.json()["error"] and "'mini', 'other'" in refused.json()["error"], route
        for model in ("mini", "other", ""):
            assert httpx.post(f"{url}{route}", json={**body, "model": model}, timeout=30).status_code == 200, route
    # mini (the default) has prompts and other has none: the prompt is taken, or refused, by the model named.
    prompted = httpx.post(f"{url}/embed", json={"inputs": TEXTS, "prompt_name": "query", "model": "mini"}, timeout=30)
    plain = httpx.post(f"{url}/embed", json={"inputs": [f"query: {t}" for t in TEXTS], "model": "other"}, timeout=30)
    np.testing.assert_allclose(np.array(prompted.json()), np.array(plain.json()), atol=1e-6)
    none = httpx.post(f"{url}/embed", json={"inputs": TEXTS, "prompt_name": "query", "model": "other"}, timeout=30)
    assert none.status_code == 400 and "query" in none.json()["error"], none.text
    tokens = httpx.post(f"{url}/tokenize", json={"inputs": "a", "prompt_name": "query", "model": "mini"}, timeout=30)
    assert [t["text"] for t in tokens.json()[0]][1:3] == ["query", ":"]


def test_each_model_has_its_own_batch_and_queue_metrics(two, client):
    client.embed(TEXTS, model="mini")
    client.embed(TEXTS, model="other")
    metrics = two.metrics()
    for model in ("mini", "other"):
        assert metrics[f'attnserve_batch_size_count{{graph="embeddings",model="{model}"}}'] >= 1
        assert metrics[f'attnserve_batch_tokens_computed_total{{model="{model}"}}'] > 0
        assert metrics[f'attnserve_queue_depth_tokens{{model="{model}"}}'] == 0


def test_a_raw_prompt_equals_prepending_it_on_every_protocol(two, client):
    prompted = ["query: " + t for t in TEXTS]
    expected = client.embed(prompted, model="other")
    np.testing.assert_allclose(client.embed(TEXTS, model="other", prompt="query: "), expected, atol=1e-6)
    body = {"input": TEXTS, "model": "other", "prompt": "query: ", "encoding_format": "float"}
    reply = httpx.post(f"{two.http_url}/v1/embeddings", json=body, timeout=30).json()
    np.testing.assert_allclose([d["embedding"] for d in reply["data"]], expected, atol=1e-5)  # normalised, as ours
    assert not np.allclose(expected, client.embed(TEXTS, model="other"), atol=1e-3)  # the prompt made a difference
    # Its tokens count toward max_seq_length, as in sentence-transformers.
    one = client.encode(["word " * 300], model="other", prompt="query: ", truncate=True, token_embeddings=True)[0]
    assert one.num_tokens == 256 and one.tokens[1:3] == ["query", ":"]


def test_a_named_prompt_on_tei_grpc_and_openai(two, client):
    expected = client.embed(["query: " + t for t in TEXTS], model="mini")
    np.testing.assert_allclose(client.embed(TEXTS, prompt_name="query"), expected, atol=1e-6)
    reply = httpx.post(f"{two.http_url}/embed", json={"inputs": TEXTS, "prompt_name": "query"}, timeout=30)
    np.testing.assert_allclose(reply.json(), expected, atol=1e-5)
    with pytest.raises(RequestError, match="'query', 'passage'"):
        client.embed(TEXTS, prompt_name="nope")


def test_prompt_mistakes_are_one_line_errors(two, client):
    with pytest.raises(RequestError) as caught:
        client.embed(TEXTS, model="other", prompt_name="query")  # other's manifest has no prompts
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt_name 'query' does not exist: the model has no prompts" in caught.value.details
    assert caught.value.error_details.field == "prompt_name"
    with pytest.raises(RequestError, match="not both"):
        client.embed(TEXTS, prompt_name="query", prompt="q: ")
    with pytest.raises(RequestError, match="token ids"):
        client.embed([[101, 7592, 102]], prompt="query: ")
    reply = httpx.post(f"{two.http_url}/embed", json={"inputs": TEXTS, "prompt": "q", "prompt_name": "x"}, timeout=30)
    assert reply.status_code == 400 and "not both" in reply.json()["error"]


def test_encode_dimensions_and_prompt_equal_the_servers(two, client, artifacts, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    expected = client.embed(TEXTS, model="other", dimensions=48, prompt="query: ")
    for engine in (["--artifacts", str(artifacts)], ["--server", two.target, "--model", "other"]):
        out = tmp_path / f"out{len(engine)}.parquet"
        result = run_cli("encode", source, "-o", out, "--no-progress", "--dimensions", "48", "--prompt", "query: ",
                         *engine)
        assert result.returncode == 0, result.stderr
        table = pq.read_table(out)
        assert table.schema.field("embedding").type.list_size == 48
        got = table.column("embedding").combine_chunks().values.to_numpy().reshape(len(TEXTS), 48)
        np.testing.assert_allclose(got, expected, atol=1e-5)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # cut, then normalised
        assert json.loads(table.schema.metadata[b"attnserve"])["dimensions"] == 48
    result = run_cli("encode", source, "-o", tmp_path / "bad.parquet", "--artifacts", artifacts, "--dimensions", "999")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].endswith(
        "dimensions 999 is out of range: this model's embeddings have 384 (ask for 1 to 384)")


def test_model_flags_refuse_mistakes_in_one_line(artifacts, tmp_path):
    def refused(*flags: str) -> str:
        result = run_cli("serve", "--port", "0", "--http-port", "-1", "--metrics-port", "-1", *flags)
        assert result.returncode == 1, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        return lines[0]

    assert "give it as NAME=ARTIFACT_DIR" in refused("--model", str(artifacts))
    assert "is not a directory" in refused("--model", f"a={tmp_path / 'missing'}")
    assert "'a' is given twice" in refused("--model", f"a={artifacts}", "--model", f"a={artifacts}")
    assert "not both" in refused("--model", f"a={artifacts}", "--artifacts", str(artifacts))
    assert "holds no artifact directory" in refused("--model-repository", str(tmp_path))


def test_a_repository_serves_each_artifact_folder_by_name_and_skips_the_rest(artifacts, tmp_path):
    (tmp_path / "zeta").symlink_to(artifacts)
    (tmp_path / "alpha").symlink_to(artifacts)
    (tmp_path / "notes").mkdir()
    sources = model_sources(None, ServerConfig(model_repository=str(tmp_path)))
    assert [(s.name, s.directory.name) for s in sources] == [("alpha", "alpha"), ("zeta", "zeta")]
    assert load_manifest(sources[0].directory).model == load_manifest(artifacts).model
    with pytest.raises(ConfigError, match="not a directory"):
        model_sources(None, ServerConfig(model_repository=str(tmp_path / "missing")))


def test_threads_are_shared_out_among_the_models():
    assert thread_share(0, 1) == 0 and thread_share(4, 1) == 4  # one model: as configured
    assert thread_share(8, 2) == 4 and thread_share(8, 3) == 2 and thread_share(2, 4) == 1
    assert thread_share(0, 2) >= 1


def test_paired_batches_answer_concurrent_requests_as_lone_ones(two, client):
    """Under load, --pair-batches runs batches two at once on the half-width session: every row is the one a lone
    request gets (the sessions' rows are the same bit for bit), on both models."""
    from concurrent.futures import ThreadPoolExecutor

    texts = [f"{word} number {i} " * (1 + i % 9) for i, word in enumerate(["cat", "train", "rain", "a"] * 24)]

    def embed(i: int) -> np.ndarray:
        return client.embed([texts[i]], model=("mini", "other")[i % 2])[0]

    lone = [embed(i) for i in range(len(texts))]  # one at a time: each on the full-width session
    with ThreadPoolExecutor(32) as pool:
        busy = list(pool.map(embed, range(len(texts))))
    np.testing.assert_allclose(np.stack(busy), np.stack(lone), atol=1e-6)


def test_pair_batches_pairs_on_a_cpu_with_two_in_flight():
    assert ServerConfig().pair_batches == "off" and not ServerConfig().pairs_batches_on(gpu=False)
    paired = ServerConfig(pair_batches="on")
    assert paired.pairs_batches_on(gpu=False) and paired.batches_in_flight_on(gpu=False) == 2
    assert not paired.pairs_batches_on(gpu=True)  # a GPU's batches share no cores
    assert ServerConfig(pair_batches="on", batches_in_flight=2).batches_in_flight_on(gpu=False) == 2
    with pytest.raises(ConfigError, match="batches_in_flight must be 0 or 2 with it"):
        ServerConfig(pair_batches="on", batches_in_flight=3)


def test_batches_in_flight_0_is_the_providers_own():
    """0 (the default): one batch at a time on the CPU, whose graph takes every core; two on a GPU, where the second
    overlaps the first's host work; a number given is kept."""
    assert ServerConfig().batches_in_flight == 0
    assert ServerConfig().batches_in_flight_on(gpu=False) == 1 and ServerConfig().batches_in_flight_on(gpu=True) == 2
    assert ServerConfig(batches_in_flight=3).batches_in_flight_on(gpu=False) == 3
    with pytest.raises(ConfigError, match="batches_in_flight must be >= 0"):
        ServerConfig(batches_in_flight=-1)
