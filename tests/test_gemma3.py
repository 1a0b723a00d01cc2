"""Gemma 3's text model (model/gemma3.py) against transformers' Gemma3TextModel and sentence-transformers'
EmbeddingGemma pipeline, on a tiny random-weight checkpoint saved by transformers itself (tests/tiny_gemma3.py):
4 layers, hidden 64, 4 query heads of size 32 over 2 key/value heads, layer 1 full and the others sliding with a
window of 8 (4 keys either side, bidirectional), so that texts of 6 tokens and more really use the window."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnserve.config import EngineConfig
from attnserve.engine.engine import Engine
from attnserve.errors import CheckpointError
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.gemma3 import FULL, SLIDING, Gemma3Encoder, read_config

from .checkpoints import edit_json
from .conftest import assert_one_line_error, run_cli
from .family_parity import (
    LENGTHS,
    cosines,
    export,
    load_ours,
    max_error_on_real_positions,
    padded_batch,
    transformers_model,
)
from .tiny_gemma3 import PROMPTS, save_embedding_gemma, save_tiny_gemma3

MAX_SEQ_LENGTH = 40
TEXTS = ["hello world", "A LONGER sentence, with punctuation!", "café über naïve 42", "x",
         "the quick brown fox jumps over the lazy dog " * 3, "東京は日本の首都です。🙂🚀"]
SLIDING_LAYERS = [0, 2, 3]
HALF_WINDOW = 4  # sliding_window 8, bidirectional: |query - key| <= 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_gemma3(tmp_path_factory.mktemp("gemma3") / "model")


@pytest.fixture(scope="module")
def st_dir(model_dir, tmp_path_factory) -> Path:
    return save_embedding_gemma(model_dir, tmp_path_factory.mktemp("gemma3") / "st", max_seq_length=MAX_SEQ_LENGTH)


@pytest.fixture(scope="module")
def ours(model_dir) -> Gemma3Encoder:
    return load_ours(model_dir, Gemma3Encoder)


@pytest.fixture(scope="module")
def exported(st_dir, tmp_path_factory) -> tuple[Path, list[str]]:
    return export(st_dir, tmp_path_factory.mktemp("gemma3") / "artifacts")


def test_config_is_read_as_transformers_reads_it(model_dir, ours):
    cfg = ours.config
    assert cfg.layer_types == (SLIDING, FULL, SLIDING, SLIDING) and cfg.sliding_window == 8 and cfg.bidirectional
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_size, cfg.score_divisor) == (4, 2, 32, 24 ** 0.5)
    assert (cfg.global_rope_theta, cfg.local_rope_theta) == (1000.0, 100.0)
    # The 4.x form (rope_theta and rope_local_base_freq, layer types from sliding_window_pattern) reads the same,
    # here and in transformers, whose bidirectional window is exclusive: sliding_window // 2 + 1.
    import transformers

    legacy = json.loads((model_dir / "config.json").read_text())
    del legacy["layer_types"], legacy["rope_parameters"]
    legacy |= {"rope_theta": 1000.0, "rope_local_base_freq": 100.0, "sliding_window_pattern": 2}
    theirs = transformers.Gemma3TextConfig.from_dict(legacy)
    mine = read_config(legacy, model_dir / "config.json")
    assert mine == dataclasses.replace(cfg, layer_types=(SLIDING, FULL, SLIDING, FULL))
    assert tuple(theirs.layer_types) == mine.layer_types and theirs.sliding_window == HALF_WINDOW + 1
    assert [theirs.rope_parameters[t]["rope_theta"] for t in (FULL, SLIDING)] == [1000.0, 100.0]


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_last_hidden_state_matches_transformers(model_dir, ours, implementation):
    assert max_error_on_real_positions(ours, model_dir, implementation) <= 1e-4


def test_the_window_matters(ours):
    """The parity above would hold for a model that ignored the window; this one's outputs change without it."""
    ids, mask = padded_batch((40, 17), ours.config.vocab_size, ours.config.pad_token_id, seed=0)
    with torch.no_grad():
        windowed, _ = ours(ids, mask)
    unwindowed = Gemma3Encoder(dataclasses.replace(ours.config, sliding_window=10_000))
    unwindowed.load_state_dict(ours.state_dict())
    with torch.no_grad():
        everywhere, _ = unwindowed(ids, mask)
    assert float((windowed - everywhere).abs()[mask.bool()].max()) > 0.05


def test_attention_maps_match_transformers_and_respect_the_window(model_dir, ours):
    reference = transformers_model(model_dir, "eager")
    ids, mask = padded_batch((40, 17, 1), ours.config.vocab_size, ours.config.pad_token_id, seed=3)
    with torch.no_grad():
        _, got = ours(ids, mask, output_attentions=True)  # (L, B, nh, T, T): per query head, 4 of them
        want = torch.stack(reference(input_ids=ids, attention_mask=mask, output_attentions=True).attentions)
    assert got is not None and got.shape == (4, 3, 4, 40, 40)
    real = mask.bool()
    rows = (real[:, None, :, None] & real[:, None, None, :]).expand(4, -1, 4, -1, -1)
    assert float((got - want).abs()[rows].max()) <= 1e-5
    torch.testing.assert_close(got.sum(-1), torch.ones(4, 3, 4, 40), atol=1e-5, rtol=0)
    # From every query, padded ones included: padded keys get exactly 0.
    assert torch.count_nonzero(got[:, ~real[:, None, None, :].expand(-1, 4, 40, -1)]) == 0
    # In the sliding layers a query gives exactly 0 to keys more than 4 positions away, on either side.
    distance = (torch.arange(40)[None, :] - torch.arange(40)[:, None]).abs()
    sliding = got[SLIDING_LAYERS, 0]  # (3, nh, T, T), the 40-token row
    assert torch.count_nonzero(sliding[..., distance > HALF_WINDOW]) == 0
    assert bool((sliding[..., distance <= HALF_WINDOW] > 0).all())
    # The heads sharing a key/value head still weigh the keys each its own way.
    assert float((got[:, 0, 0] - got[:, 0, 1]).abs().max()) > 0.05


@pytest.fixture(scope="module")
def causal_dir(tmp_path_factory) -> Path:
    return save_tiny_gemma3(tmp_path_factory.mktemp("gemma3") / "causal", seed=2, use_bidirectional_attention=False)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_causal_gemma_matches_transformers(causal_dir, implementation):
    """use_bidirectional_attention false: a decoder, causal in every layer, and the sliding layers see the
    sliding_window - 1 keys before a query (the window is not halved)."""
    encoder = load_encoder(read_checkpoint(causal_dir))
    assert not encoder.config.bidirectional
    assert max_error_on_real_positions(encoder, causal_dir, implementation, LENGTHS[1:4]) <= 1e-4
    ids, mask = padded_batch((20, 11), encoder.config.vocab_size, encoder.config.pad_token_id, seed=0)
    with torch.no_grad():
        _, maps = encoder(ids, mask, output_attentions=True)
    assert maps is not None
    offset = torch.arange(20)[None, :] - torch.arange(20)[:, None]  # key - query
    assert torch.count_nonzero(maps[:, 0][..., offset > 0]) == 0  # lower-triangular
    assert torch.count_nonzero(maps[SLIDING_LAYERS, 0][..., offset <= -8]) == 0
    assert bool((maps[SLIDING_LAYERS, 0][..., (offset <= 0) & (offset > -8)] > 0).all())
    assert torch.count_nonzero(maps[:, 1, :, :, 11:]) == 0  # padded keys


def test_attn_logit_softcapping_is_left_unapplied_as_transformers_does(model_dir, tmp_path):
    capped = tmp_path / "capped"
    shutil.copytree(model_dir, capped)
    edit_json(capped / "config.json", attn_logit_softcapping=0.5, final_logit_softcapping=1.0)
    encoder = load_encoder(read_checkpoint(capped))
    assert max_error_on_real_positions(encoder, capped, "eager", LENGTHS[2:4]) <= 1e-4


@pytest.mark.parametrize("change, fragment", [
    ({"architectures": ["Gemma3ForCausalLM"]}, "cannot reproduce architecture Gemma3ForCausalLM"),
    ({"hidden_activation": "relu"}, "hidden_activation 'relu' is not supported"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "cannot reproduce rope_scaling"),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 8.0}}},
     "cannot reproduce rope_parameters['full_attention']"),
    ({"layer_types": ["full_attention"]}, "layer_types must list"),
    ({"use_bidirectional_attention": "yes"}, "use_bidirectional_attention must be true or false"),
    ({"num_key_value_heads": 3}, "num_attention_heads must be a multiple of num_key_value_heads"),
    ({"head_dim": 0}, "invalid config: sizes must be positive"),
])
def test_config_settings_the_export_cannot_run_are_refused(model_dir, tmp_path, change, fragment):
    config = tmp_path / "config.json"
    config.write_text((model_dir / "config.json").read_text())
    edit_json(config, **change)
    with pytest.raises(CheckpointError, match=fragment.replace("[", r"\[").replace("]", r"\]")) as refused:
        read_config(json.loads(config.read_text()), config)
    assert "\n" not in str(refused.value)


def test_export_refuses_in_one_line(model_dir, tmp_path):
    checkpoint = tmp_path / "scaled"
    shutil.copytree(model_dir, checkpoint)
    edit_json(checkpoint / "config.json", rope_scaling={"rope_type": "linear", "factor": 8.0})
    assert_one_line_error(run_cli("export", "--checkpoint", checkpoint, "--out", tmp_path / "out"),
                          "cannot reproduce rope_scaling")
    assert not (tmp_path / "out").exists()


def test_export_verifies_every_variant(exported):
    out, lines = exported
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["pooling"] == "mean" and manifest["embedding_size"] == 64
    assert set(manifest["variants"]) >= {"embeddings", "embeddings_fused", "embeddings_int8", "embeddings_fp16",
                                         "attention"}
    for name in ("embeddings", "embeddings_fused", "attention"):
        assert manifest["variants"][name]["parity"]["max_abs_last_hidden_state"] <= 1e-4
    assert manifest["variants"]["attention"]["parity"]["max_padded_key_weight"] == 0
    assert manifest["variants"]["embeddings_fp16"]["parity"]["min_cosine_sentence_embedding"] >= 0.999
    assert manifest["variants"]["embeddings_int8"]["parity"]["mean_cosine_sentence_embedding_texts"] >= 0.99
    assert "token_type_ids" not in {i.name for i in __import__("onnx").load(
        str(out / "embeddings.onnx")).graph.input}


def test_exported_graphs_match_pytorch_at_unseen_sizes(exported, ours):
    """Every fp32 graph against the encoder, at batch and sequence sizes the tracing never saw."""
    import onnxruntime as ort

    out = exported[0]
    for lengths in [(3,), (37, 6, 21), (40, 40, 2, 11, 29)]:
        ids, mask = padded_batch(lengths, ours.config.vocab_size, ours.config.pad_token_id, seed=len(lengths))
        with torch.no_grad():
            want = ours(ids, mask)[0].numpy()
        for graph in ("embeddings.onnx", "embeddings_fused.onnx", "attention.onnx"):
            session = ort.InferenceSession(str(out / graph), providers=["CPUExecutionProvider"])
            got = session.run(["last_hidden_state"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
            assert np.abs(got - want)[mask.bool().numpy()].max() <= 1e-4, (graph, lengths)


def test_engine_encodes_as_sentence_transformers_with_its_prompts(st_dir, exported):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(st_dir), device="cpu")
    engine = Engine.from_directory(exported[0])
    for prompt_name in (None, "query", "document"):
        expected = model.encode(TEXTS, prompt_name=prompt_name)
        encoded = engine.encode(TEXTS, prompt_name=prompt_name)
        assert expected.shape == encoded.embeddings.shape == (len(TEXTS), 64)
        assert cosines(encoded.embeddings, expected).min() >= 0.99999, prompt_name
        assert np.abs(encoded.embeddings - expected).max() <= 1e-5, prompt_name
    assert engine.manifest.prompts == PROMPTS
    # The prompt is part of the input: with and without it, embeddings differ.
    assert cosines(engine.encode(TEXTS[:1], prompt_name="query").embeddings, engine.encode(TEXTS[:1]).embeddings) < 0.99
    int8 = Engine.from_directory(exported[0], EngineConfig(precision="int8")).encode(TEXTS, prompt_name="query")
    assert cosines(int8.embeddings, model.encode(TEXTS, prompt_name="query")).min() >= 0.99


def test_engine_attention_maps_over_padding(exported):
    engine = Engine.from_directory(exported[0], attention=True)
    inputs = engine.tokenizer.encode_texts(["x", TEXTS[4]])
    T = len(inputs[1])
    out = engine.run(inputs, attention=True)
    assert out.attentions is not None and out.attentions.shape == (4, 2, 4, T, T)
    np.testing.assert_allclose(out.attentions.sum(-1), 1.0, atol=1e-5)
    assert np.count_nonzero(out.attentions[:, 0, :, :, len(inputs[0]):]) == 0
    distance = np.abs(np.arange(T)[None, :] - np.arange(T)[:, None])
    assert np.count_nonzero(out.attentions[SLIDING_LAYERS, 1][..., distance > HALF_WINDOW]) == 0
