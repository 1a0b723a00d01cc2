"""jina-embeddings-v3 (model/jina_v3.py) against transformers' JinaEmbeddingsV3Model with each task's PEFT LoRA
adapter loaded by transformers' own load_adapter, and sentence-transformers over the same folder; the per-task
graphs (export/task_graphs.py) and `task` on every door. The checkpoint is tiny (tests/tiny_jina.py): 2 layers,
hidden 32, five adapters whose both factors are random, so each task moves the hidden states by about as much as
they are large."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from attnserve.engine.engine import Engine
from attnserve.engine.manifest import load_manifest
from attnserve.engine.tasks import task_directory
from attnserve.errors import CheckpointError, InvalidInputError
from attnserve.export.artifacts import add_variants, build_artifacts
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.jina_v3 import TASKS, JinaV3Encoder, with_task

from .checkpoints import edit_json, save_sentence_transformer
from .conftest import assert_one_line_error, run_cli
from .family_parity import cosines, padded_batch
from .tiny_jina import save_tiny_jina

MAX_SEQ_LENGTH = 40
TEXTS = ["hello world", "A LONGER sentence, with punctuation!", "x", "the quick brown fox jumps over the lazy dog " * 6,
         "café über naïve 42"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_jina(tmp_path_factory.mktemp("jina") / "model")


@pytest.fixture(scope="module")
def st_dir(model_dir, tmp_path_factory) -> Path:
    """sentence-transformers' own save (Transformer -> Pooling(mean) -> Normalize), with the adapters beside it:
    its save writes the transformers model, not the PEFT folders."""
    st = save_sentence_transformer(model_dir, tmp_path_factory.mktemp("jina") / "st", "mean", normalize=True,
                                   max_seq_length=MAX_SEQ_LENGTH)
    shutil.copytree(model_dir / "adapters", st / "adapters")
    return st


@pytest.fixture(scope="module")
def exported(st_dir, tmp_path_factory) -> Path:
    """Every task's graph set holds the graphs that differ by task (the adapter merged into the weights); int8, whose
    search measures many candidates, is built once, for the model without a task: the same graph code quantizes
    every task's."""
    out = tmp_path_factory.mktemp("jina") / "artifacts"
    build_artifacts(read_checkpoint(st_dir), out, log=lambda line: None,
                    variants=["embeddings", "embeddings_fused", "embeddings_fp16", "attention", "attention_last"])
    add_variants(out, ["embeddings_int8"], log=lambda line: None)
    return out


def ours(directory: Path, task: str | None) -> JinaV3Encoder:
    ckpt = read_checkpoint(directory)
    encoder = load_encoder(replace(ckpt, config=with_task(ckpt.config, task)))
    assert isinstance(encoder, JinaV3Encoder)
    return encoder


def transformers_model(directory: Path, task: str | None, implementation: str = "eager"):
    """transformers' JinaEmbeddingsV3Model with the task's adapter loaded by its PEFT integration (the one adapter
    loaded is the active one; PEFT forbids dots in adapter names)."""
    import transformers

    model = transformers.JinaEmbeddingsV3Model.from_pretrained(str(directory), attn_implementation=implementation)
    if task is not None:
        model.load_adapter(str(directory / "adapters" / task), adapter_name=task.replace(".", "_"))
    return model.eval()


@pytest.mark.parametrize("task", [None, *TASKS])
def test_last_hidden_state_matches_transformers_with_the_tasks_adapter(model_dir, task):
    encoder = ours(model_dir, task)
    ids, mask = padded_batch((23, 9, 1), encoder.config.vocab_size, encoder.config.pad_token_id, seed=1)
    with torch.no_grad():
        got, _ = encoder(ids, mask)
        base, _ = ours(model_dir, None)(ids, mask)
        for implementation in ("eager", "sdpa"):
            want = transformers_model(model_dir, task, implementation)(input_ids=ids, attention_mask=mask)
            assert float((got - want.last_hidden_state).abs()[mask.bool()].max()) <= 1e-4
    if task is not None:  # the adapter matters: the check above could not pass with the base weights
        assert float((got - base).abs()[mask.bool()].max()) > 0.5


def test_attention_maps_sum_to_one_and_give_padding_nothing(model_dir):
    encoder = ours(model_dir, "retrieval.query")
    ids, mask = padded_batch((17, 5), encoder.config.vocab_size, encoder.config.pad_token_id, seed=2)
    with torch.no_grad():
        _, attentions = encoder(ids, mask, output_attentions=True)
        want = transformers_model(model_dir, "retrieval.query")(input_ids=ids, attention_mask=mask,
                                                                output_attentions=True).attentions
    assert attentions is not None and attentions.shape == (2, 2, 4, 17, 17)
    torch.testing.assert_close(attentions.sum(-1), torch.ones(2, 2, 4, 17), atol=1e-5, rtol=0)
    assert torch.count_nonzero(attentions[:, 1, :, :, 5:]) == 0
    for layer in range(2):
        assert float((attentions[layer, 0] - want[layer][0]).abs().max()) <= 1e-5


def test_export_writes_a_verified_graph_set_per_task(exported):
    manifest = load_manifest(exported)
    assert manifest.tasks == TASKS and manifest.task is None and manifest.family == "jina_embeddings_v3"
    for task in TASKS:
        sub = load_manifest(task_directory(manifest, task))  # checks every file's sha256
        assert sub.task == task and sub.tasks == ()
        for name in ("embeddings", "embeddings_fused", "attention"):
            assert sub.variants[name].parity["max_abs_last_hidden_state"] <= 1e-4
        assert sub.variants["attention"].parity["max_padded_key_weight"] == 0
        assert sub.variants["embeddings_fp16"].parity["min_cosine_sentence_embedding"] >= 0.999
    assert manifest.variants["embeddings_int8"].parity["mean_cosine_sentence_embedding_texts"] >= 0.99


@pytest.mark.parametrize("task", [None, "retrieval.passage", "text-matching"])
def test_graphs_match_pytorch_at_unseen_sizes(st_dir, exported, task):
    """The fp32 graph of each task against PyTorch with that adapter, on batch and sequence sizes the export did
    not trace or verify with."""
    engine = Engine.from_directory(task_directory(load_manifest(exported), task))
    encoder = ours(st_dir, task)
    for lengths in ((31,), (7, 38, 2), (13, 13, 13, 1, 29)):
        ids, mask = padded_batch(lengths, encoder.config.vocab_size, encoder.config.pad_token_id, seed=len(lengths))
        hidden, _ = engine._session.run(["last_hidden_state", "sentence_embedding"],
                                        {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        with torch.no_grad():
            want, _ = encoder(ids, mask)
        assert np.abs(hidden - want.numpy())[mask.numpy().astype(bool)].max() <= 1e-4


@pytest.mark.parametrize("task", [None, *TASKS])
def test_sentence_embeddings_match_sentence_transformers(st_dir, exported, task):
    """sentence-transformers loads JinaEmbeddingsV3Model without remote code; a task's adapter goes in through
    transformers' load_adapter on its Transformer module, as on the bare model."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(st_dir), device="cpu")
    if task is not None:
        model[0].auto_model.load_adapter(str(st_dir / "adapters" / task), adapter_name=task.replace(".", "_"))
    expected = model.encode(TEXTS)
    encoded = Engine.from_directory(task_directory(load_manifest(exported), task)).encode(TEXTS)
    assert cosines(encoded.embeddings, expected).min() >= 0.99999


def test_a_task_is_refused_by_a_model_without_adapters_and_an_unknown_one_by_any(exported):
    with pytest.raises(InvalidInputError, match="has no task adapters") as refused:
        task_directory(replace(load_manifest(exported), tasks=()), "retrieval.query")
    assert "\n" not in str(refused.value)
    with pytest.raises(InvalidInputError, match="'retrieval' is not one of .*tasks: retrieval.query, "):
        task_directory(load_manifest(exported), "retrieval")


@pytest.mark.parametrize("change, fragment", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 2.0}}, "cannot reproduce rope_param"),
    ({"lora_adaptations": ["retrieval.query"]}, "adapter 'classification' is not in config.json's lora_adaptations"),
    ({"lora_adaptations": [*TASKS, "summarize"]}, "lora_adaptations names 'summarize'"),
    ({"hidden_act": "swish"}, "hidden_act 'swish' is not supported"),
    ({"architectures": ["JinaEmbeddingsV3ForSequenceClassification"]}, "cannot reproduce architecture"),
])
def test_config_settings_the_export_cannot_run_are_refused(model_dir, tmp_path, change, fragment):
    checkpoint = tmp_path / "model"
    shutil.copytree(model_dir, checkpoint)
    edit_json(checkpoint / "config.json", **change)
    with pytest.raises(CheckpointError, match=fragment.replace("[", r"\[")) as refused:
        read_checkpoint(checkpoint)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("change, fragment", [
    ({"use_dora": True}, "cannot reproduce use_dora True"),
    ({"use_rslora": True}, "cannot reproduce use_rslora True"),
    ({"target_modules": ["dense"]}, "cannot reproduce target_modules"),
    ({"modules_to_save": ["pooler"]}, "cannot reproduce modules_to_save"),
])
def test_adapter_settings_the_export_cannot_run_are_refused_before_any_weight_loads(model_dir, tmp_path, change,
                                                                                      fragment):
    checkpoint = tmp_path / "model"
    shutil.copytree(model_dir, checkpoint)
    edit_json(checkpoint / "adapters" / "separation" / "adapter_config.json", **change)
    (checkpoint / "model.safetensors").write_bytes(b"not read")  # the refusal comes from metadata alone
    assert_one_line_error(run_cli("export", "--checkpoint", checkpoint, "--out", tmp_path / "out"), fragment)
    assert not (tmp_path / "out").exists()


def test_task_on_every_door_and_in_encode(exported, tmp_path):
    """A real `attnserve serve`: gRPC's EmbedRequest.task, the openai client's extra_body, TEI's /embed and KServe's
    parameters each get the task's graphs; an unknown task is a bad request on each; `encode --task` writes the
    same vectors offline."""
    import grpc
    import httpx
    import openai
    import pyarrow.parquet as pq

    from attnserve.client.client import make_request, to_result

    from .serving import ServerProcess, serving

    manifest = load_manifest(exported)
    expected = {task: Engine.from_directory(task_directory(manifest, task)).encode(TEXTS[:3]).embeddings
                for task in (None, "retrieval.query", "separation")}
    assert cosines(expected["retrieval.query"], expected[None]).max() < 0.999  # the tasks really differ
    with serving(ServerProcess(exported, log_path=tmp_path / "server.log")) as server:
        with server.channel() as channel:
            stub = server.stub(channel)
            info = stub.GetModelInfo(__import__("attnserve.v1.encoder_pb2", fromlist=["x"]).GetModelInfoRequest())
            assert tuple(info.tasks) == TASKS
            for task in (None, "retrieval.query", "separation"):
                request = make_request(TEXTS[:3], normalize=True)
                if task is not None:
                    request.task = task
                got = np.stack([to_result(e).sentence_embedding for e in stub.Embed(request, timeout=60).embeddings])
                np.testing.assert_allclose(got, expected[task], atol=2e-6)
            request = make_request(TEXTS[:1])
            request.task = "retrieval"
            with pytest.raises(grpc.RpcError) as refused:
                stub.Embed(request, timeout=60)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "'retrieval' is not one of" in refused.value.details()
        client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused")
        reply = client.embeddings.create(model="", input=TEXTS[:3], extra_body={"task": "separation"})
        np.testing.assert_allclose([d.embedding for d in reply.data], expected["separation"], atol=2e-6)
        with pytest.raises(openai.BadRequestError, match="not one of"):
            client.embeddings.create(model="", input=TEXTS[:1], extra_body={"task": "nope"})
        tei = httpx.post(f"{server.http_url}/embed", json={"inputs": TEXTS[:3], "task": "retrieval.query"})
        assert tei.status_code == 200, tei.text
        np.testing.assert_allclose(tei.json(), expected["retrieval.query"], atol=2e-6)
        assert httpx.post(f"{server.http_url}/embed", json={"inputs": "x", "task": "nope"}).status_code == 400
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS[:3]) + "\n")
    result = run_cli("encode", source, "-o", tmp_path / "out.parquet", "--artifacts", exported, "--task",
                     "separation", "--no-progress")
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.stack(pq.read_table(tmp_path / "out.parquet")["embedding"].to_numpy(
        zero_copy_only=False)), expected["separation"], atol=2e-6)
    assert_one_line_error(run_cli("encode", source, "-o", tmp_path / "bad.parquet", "--artifacts", exported,
                                  "--task", "summarize"), "'summarize' is not one of")


def test_a_model_without_adapters_refuses_a_task_on_the_doors(artifacts, tmp_path):
    """The default model (MiniLM) has no adapters: a task is INVALID_ARGUMENT / 400, in one line."""
    import grpc
    import httpx

    from attnserve.client.client import make_request

    from .serving import ServerProcess, serving

    with serving(ServerProcess(artifacts, log_path=tmp_path / "server.log")) as server:
        with server.channel() as channel:
            request = make_request(["hello"])
            request.task = "retrieval.query"
            with pytest.raises(grpc.RpcError) as refused:
                server.stub(channel).Embed(request, timeout=60)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "has no task adapters" in refused.value.details()
        reply = httpx.post(f"{server.http_url}/v1/embeddings", json={"input": "x", "model": "",
                                                                     "task": "retrieval.query"})
        assert reply.status_code == 400 and "has no task adapters" in json.dumps(reply.json())
