"""The shared engine: artifact checks, input validation, batching by length, and results equal to PyTorch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnserve.config import EngineConfig
from attnserve.engine.batching import pad, plan_batches
from attnserve.engine.engine import Engine
from attnserve.engine.manifest import load_manifest
from attnserve.errors import ArtifactError, ConfigError, InvalidInputError
from attnserve.model.pooling import pool

from .conftest import VARIED_TEXTS


def test_engine_equals_pytorch_in_any_batch_composition_and_normalises_as_asked(engine, encoder):
    inputs = engine.tokenizer.encode_texts(VARIED_TEXTS)
    together = engine.encode_tokenized(inputs, normalize=False).embeddings
    for i, x in enumerate(inputs):
        alone = engine.encode_tokenized([x], normalize=False).embeddings[0]
        assert np.abs(together[i] - alone).max() <= 1e-5
        with torch.no_grad():
            hidden, _ = encoder(torch.from_numpy(x.ids[None]), torch.ones(1, len(x), dtype=torch.int64))
        assert np.abs(alone - pool(hidden, torch.ones(1, len(x)), "mean")[0].numpy()).max() <= 1e-4
    # Normalised as the model says, unless asked not to.
    default, raw = engine.encode(["hello world"]).embeddings, engine.encode(["hello world"], normalize=False).embeddings
    assert np.isclose(np.linalg.norm(default), 1.0, atol=1e-6) and not np.isclose(np.linalg.norm(raw), 1.0)


def test_attention_graph_rows_sum_to_one_and_padding_gets_zero(engine):
    inputs = engine.tokenizer.encode_texts(["tiny", "a considerably longer input sentence for this batch"])
    out = engine.run(inputs, attention=True)
    L, B, nh, T, _ = out.attentions.shape
    assert (L, B, nh) == (6, 2, 12)
    np.testing.assert_allclose(out.attentions.sum(-1), 1.0, atol=1e-5)
    short = len(inputs[0])
    assert np.count_nonzero(out.attentions[:, 0, :, :, short:]) == 0


def test_plan_batches_respects_budget_covers_every_input_and_pads_little():
    rng = np.random.default_rng(0)
    # The benchmark's mix, 2000 texts: half short, a third medium, the rest long up to max_seq_length; and 70 short
    # texts of 6..28 tokens, which fit one budget but as one batch would be 39% padding: each split must save more
    # padding than a run costs (BATCH_OVERHEAD_CELLS).
    mix = np.concatenate([rng.integers(6, 23, 1000), rng.integers(23, 80, 700), rng.integers(80, 257, 300)])
    for lengths, max_batch_size, most_padding in ((mix, 64, 0.05), (np.linspace(6, 28, 70).astype(int), 256, 0.2)):
        batches = plan_batches(lengths, max_batch_tokens=2048, max_batch_size=max_batch_size)
        assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
        assert all(len(b) <= max_batch_size and lengths[b].max() * len(b) <= 2048 for b in batches)
        cells = sum(lengths[b].max() * len(b) for b in batches)
        assert len(batches) > 1 and (cells - lengths.sum()) / cells < most_padding  # sorting keeps padding small
    assert plan_batches([5000, 3], 2048, 8)[0].tolist() == [0]  # over budget alone: a batch of its own
    assert plan_batches([], 2048, 8) == []


def test_pad_masks_exactly_the_padding():
    ids, mask = pad([np.array([1, 2, 3]), np.array([4])])
    assert ids.tolist() == [[1, 2, 3], [4, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]


@pytest.mark.parametrize("call, message", [
    *((lambda t, text=text: t.encode_texts(["fine", text]), "input 1: empty text") for text in ("", "   ", "\n\t")),
    (lambda t: t.encode_ids([[101, 30522, 102]]), r"token id 30522 is out of range \[0, 30522\)"),
    (lambda t: t.encode_ids([[101, -1, 102]]), "out of range"),
    (lambda t: t.encode_ids([[]]), "empty token id list"),
    (lambda t: t.encode_texts(["word " * 300], truncate=False), "longer than max_seq_length 256"),
    (lambda t: t.encode_ids([[7] * 300], truncate=False), "exceed max_seq_length"),
], ids=["empty", "spaces", "newline-tab", "id past the vocabulary", "negative id", "no ids", "text too long",
        "ids too long"])
def test_invalid_inputs_are_refused(engine, call, message):
    with pytest.raises(InvalidInputError, match=message):
        call(engine.tokenizer)


def test_overlong_ids_are_truncated_unless_asked_not_to(engine):
    (x,) = engine.tokenizer.encode_ids([[7] * 300])
    assert len(x) == 256 and x.truncated


def edit_manifest(directory, **fields) -> None:
    path = directory / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_the_manifest_says_every_layer_attends_to_every_key_for_a_bidirectional_model(artifacts):
    assert load_manifest(artifacts, check_hashes=False).attention_reach == ((None, None),) * 6


def zero_the_tail(path) -> None:
    with open(path, "r+b") as f:
        f.seek(-16, 2)
        f.write(b"\x00" * 16)


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "manifest.json").unlink(), "no manifest.json in .*: not an artifact directory"),
    (lambda d: (d / "embeddings_int8.onnx").unlink(), "artifact file missing: .*embeddings_int8.onnx"),
    (lambda d: zero_the_tail(d / "embeddings_fused.onnx"), "sha256 mismatch.*embeddings_fused.onnx"),
    (lambda d: (d / "manifest.json").write_text(json.dumps({"format_version": 1, "model": "x"})),
     "unreadable or incomplete"),
    (lambda d: edit_manifest(d, attention_reach=[[None, None]] * 5), "attention_reach has 5 layers, not 6"),
    (lambda d: edit_manifest(d, attention_reach=[[None, -1]] * 6), "unreadable or incomplete.*non-negative"),
    (lambda d: edit_manifest(d, attention_reach=[["3", 0]] * 6), "unreadable or incomplete.*non-negative"),
    (lambda d: edit_manifest(d, attention_reach=[[1]] * 6), "unreadable or incomplete"),
], ids=["no manifest", "a file missing", "a file tampered with", "a corrupt manifest", "reach of too few layers",
        "a negative reach", "a reach of text", "a reach of one bound"])
def test_damaged_artifacts_are_refused(artifacts_copy, damage, message):
    damage(artifacts_copy)
    with pytest.raises(ArtifactError, match=message):
        load_manifest(artifacts_copy)


@pytest.mark.parametrize("precision", ["fp32", "int8", "fp16"])
def test_every_precision_runs_on_cpu(artifacts, engine, precision):
    # Batches of 256 tokens: the first start on a precision times its graphs at the batch sizes configured.
    other = Engine.from_directory(artifacts, EngineConfig(precision=precision, provider="cpu", max_batch_tokens=256))
    got = other.encode(VARIED_TEXTS).embeddings
    want = engine.encode(VARIED_TEXTS).embeddings
    assert (got * want).sum(1).min() >= (0.97 if precision == "int8" else 0.999)


def test_max_batch_tokens_0_is_the_providers_own_budget(engine):
    """0 (the default): 2048 on the CPU (cache-sized products), TEI's 16384 on a GPU; a number given is kept."""
    assert EngineConfig().max_batch_tokens == 0 and engine.config.max_batch_tokens == 2048
    assert EngineConfig().batch_tokens_on(gpu=False) == 2048 and EngineConfig().batch_tokens_on(gpu=True) == 16384
    assert EngineConfig(max_batch_tokens=4096).batch_tokens_on(gpu=True) == 4096
    with pytest.raises(ConfigError, match="max_batch_tokens must be 0"):
        EngineConfig(max_batch_tokens=-1)


def test_batch_cost_0_is_the_providers_own_and_a_dearer_run_makes_fewer_larger_batches(engine):
    """0 (the default): a run costs 64 padded tokens on the CPU, 1024 on a GPU; the planner cuts less where it
    costs more, and never past the budget."""
    assert EngineConfig().batch_cost_tokens == 0 and engine.config.batch_cost_tokens == 64
    assert EngineConfig().batch_cost_on(gpu=True) == 1024 and EngineConfig(batch_cost_tokens=7).batch_cost_on(True) == 7
    with pytest.raises(ConfigError, match="batch_cost_tokens must be 0"):
        EngineConfig(batch_cost_tokens=-1)
    lengths = np.random.default_rng(1).integers(6, 257, 256)
    cpu, gpu = plan_batches(lengths, 16384, 256), plan_batches(lengths, 16384, 256, run_cells=1024)
    for plan in (cpu, gpu):
        assert sorted(np.concatenate(plan).tolist()) == list(range(len(lengths)))
        assert all(lengths[b].max() * len(b) <= 16384 for b in plan)
    assert len(gpu) < len(cpu)
    want = plan_batches(lengths, engine.batch_tokens, 256)
    assert [b.tolist() for b in engine.plan(lengths)] == [b.tolist() for b in want]


def test_encode_overlapping_tokenizing_with_runs_gives_every_row_in_order(engine, monkeypatch):
    """encode with overlaps_tokenizing (off by default; bench/gpu_check.py measures it on a GPU) tokenizes a chunk
    while the one before runs: the same rows, in order, as in one go; an error names its input by its place in the
    whole list."""
    texts = [f"text {i} " + "more words " * (i % 30) for i in range(1100)]
    whole = engine.encode(texts)
    monkeypatch.setattr(engine, "overlaps_tokenizing", True)
    overlapped = engine.encode(texts)
    assert overlapped.embeddings.shape == whole.embeddings.shape and overlapped.stats.texts == 1100
    assert (overlapped.embeddings * whole.embeddings).sum(1).min() >= 0.99999
    np.testing.assert_array_equal(overlapped.num_tokens, whole.num_tokens)
    np.testing.assert_array_equal(overlapped.truncated, whole.truncated)
    assert overlapped.stats.tokens == whole.stats.tokens
    texts[1030] = "word " * 2000
    with pytest.raises(InvalidInputError, match="input 1030"):
        engine.encode(texts, truncate=False)


def test_a_batch_without_token_states_fetches_the_sentence_embeddings_alone(engine):
    inputs = engine.tokenizer.encode_texts(VARIED_TEXTS)
    whole, alone = engine.run(inputs), engine.run(inputs, token_states=False)
    assert alone.last_hidden_state is None and whole.last_hidden_state is not None
    np.testing.assert_array_equal(alone.sentence_embedding, whole.sentence_embedding)


def test_cuda_requested_without_cuda_is_a_config_error(artifacts):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this machine has the CUDA provider")
    with pytest.raises(ConfigError, match="no CUDA provider"):
        Engine.from_directory(artifacts, EngineConfig(provider="cuda"))
