"""EuroBERT (model/eurobert.py) against transformers' EuroBertModel and sentence-transformers, on a tiny random-weight
checkpoint saved by transformers itself (tests/tiny_eurobert.py): 4 layers, hidden 64, 4 query heads of size 32
over 2 key/value heads, and a byte-level BPE tokenizer whose end-of-text token is also the padding token."""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from attnserve.config import EngineConfig
from attnserve.engine.engine import Engine
from attnserve.errors import CheckpointError
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.eurobert import EuroBertEncoder, read_config

from . import family_parity
from .checkpoints import edit_json, save_pipeline
from .conftest import assert_one_line_error, run_cli
from .family_parity import LENGTHS, cosines, export, load_ours, transformers_model
from .tiny_eurobert import save_tiny_eurobert

MAX_SEQ_LENGTH = 40
TEXTS = ["hello world", "A LONGER sentence, with punctuation!", "café über naïve 42", "x",
         "the quick brown fox jumps over the lazy dog " * 12, "東京は日本の首都です。🙂🚀"]
PROMPTS = {"query": "query: ", "document": "passage: "}
# Random ids are drawn from 3 up in this file (from 4 in the other family tests).
padded_batch = partial(family_parity.padded_batch, first_id=3)
max_error_on_real_positions = partial(family_parity.max_error_on_real_positions, first_id=3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_eurobert(tmp_path_factory.mktemp("eurobert") / "model")


@pytest.fixture(scope="module")
def st_dir(model_dir, tmp_path_factory) -> Path:
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    return save_pipeline(model_dir, tmp_path_factory.mktemp("eurobert") / "st",
                         lambda size: [Pooling(size, "mean"), Normalize()], max_seq_length=MAX_SEQ_LENGTH,
                         prompts=PROMPTS)


@pytest.fixture(scope="module")
def ours(model_dir) -> EuroBertEncoder:
    return load_ours(model_dir, EuroBertEncoder)


@pytest.fixture(scope="module")
def exported(st_dir, tmp_path_factory) -> tuple[Path, list[str]]:
    return export(st_dir, tmp_path_factory.mktemp("eurobert") / "artifacts")


def test_config_is_read_as_transformers_reads_it(model_dir, ours):
    cfg = ours.config
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_size, cfg.rope_theta) == (4, 2, 32, 1000.0)
    assert (cfg.activation, cfg.attention_bias, cfg.mlp_bias, cfg.rms_norm_eps) == ("silu", False, False, 1e-5)
    # The 4.x form (rope_theta beside the other keys; no head_dim or key/value heads: the defaults) reads as
    # transformers reads it.
    import transformers

    legacy = json.loads((model_dir / "config.json").read_text())
    del legacy["rope_parameters"], legacy["head_dim"], legacy["num_key_value_heads"], legacy["pad_token_id"]
    legacy |= {"rope_theta": 500.0, "clf_pooling": "bos"}
    theirs = transformers.EuroBertConfig.from_dict(legacy)
    mine = read_config(legacy, model_dir / "config.json")
    assert (mine.head_size, mine.num_kv_heads, mine.pad_token_id) == (
        theirs.head_dim, theirs.num_key_value_heads, theirs.pad_token_id) == (16, 4, 128001)
    assert mine.rope_theta == theirs.rope_parameters["rope_theta"] == 500.0


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_last_hidden_state_matches_transformers(model_dir, ours, implementation):
    assert max_error_on_real_positions(ours, model_dir, implementation) <= 1e-4


def test_attention_maps_match_transformers_and_give_padding_nothing(model_dir, ours):
    reference = transformers_model(model_dir, "eager")
    ids, mask = padded_batch((40, 17, 1), ours.config.vocab_size, ours.config.pad_token_id, seed=3)
    with torch.no_grad():
        _, got = ours(ids, mask, output_attentions=True)  # (L, B, nh, T, T): per query head
        want = torch.stack(reference(input_ids=ids, attention_mask=mask, output_attentions=True).attentions)
    assert got is not None and got.shape == (4, 3, 4, 40, 40)
    real = mask.bool()
    rows = (real[:, None, :, None] & real[:, None, None, :]).expand(4, -1, 4, -1, -1)
    assert float((got - want).abs()[rows].max()) <= 1e-5
    torch.testing.assert_close(got.sum(-1), torch.ones(4, 3, 4, 40), atol=1e-5, rtol=0)
    assert torch.count_nonzero(got[:, ~real[:, None, None, :].expand(-1, 4, 40, -1)]) == 0  # padded keys
    assert bool((got[:, 0] > 0).all())  # bidirectional: every real key, before and after the query
    assert float((got[:, 0, 0] - got[:, 0, 1]).abs().max()) > 0.05  # heads sharing a key/value head differ


def test_masked_lm_checkpoint_loads_its_encoder_and_a_classifier_is_refused(tmp_path):
    masked = save_tiny_eurobert(tmp_path / "mlm", model_class="EuroBertForMaskedLM", seed=1)
    encoder = load_encoder(read_checkpoint(masked))  # keys under "model.", lm_head unused
    assert max_error_on_real_positions(encoder, masked, "eager", LENGTHS[1:3]) <= 1e-4

    classifier = save_tiny_eurobert(tmp_path / "cls", model_class="EuroBertForSequenceClassification")
    with pytest.raises(CheckpointError, match="cannot reproduce architecture EuroBertForSequenceClassification"):
        read_checkpoint(classifier)
    edit_json(classifier / "config.json", architectures=["EuroBertModel"])  # the head's weights still say so
    with pytest.raises(CheckpointError, match=r"cannot reproduce the head"):
        read_checkpoint(classifier)


def test_biases_where_the_config_asks_for_them(tmp_path):
    model = save_tiny_eurobert(tmp_path / "biased", seed=2, attention_bias=True, mlp_bias=True)
    encoder = load_encoder(read_checkpoint(model))
    assert sum(name.endswith(".bias") for name, _ in encoder.named_parameters()) == 4 * 7
    assert max_error_on_real_positions(encoder, model, "eager", LENGTHS[2:4]) <= 1e-4


@pytest.mark.parametrize("change, fragment", [
    ({"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "cannot reproduce rope_scaling"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1000.0, "factor": 8.0}},
     "cannot reproduce rope_parameters"),
    ({"partial_rotary_factor": 0.5}, "cannot reproduce partial_rotary_factor"),
    ({"mlp_bias": "no"}, "mlp_bias must be true or false"),
    ({"num_key_value_heads": 3}, "num_attention_heads must be a multiple of num_key_value_heads"),
    ({"architectures": ["EuroBertForTokenClassification"]}, "cannot reproduce architecture"),
])
def test_config_settings_the_export_cannot_run_are_refused(model_dir, tmp_path, change, fragment):
    config = tmp_path / "config.json"
    config.write_text((model_dir / "config.json").read_text())
    edit_json(config, **change)
    with pytest.raises(CheckpointError, match=fragment) as refused:
        read_config(json.loads(config.read_text()), config)
    assert "\n" not in str(refused.value)


def test_export_refuses_in_one_line(model_dir, tmp_path):
    checkpoint = tmp_path / "scaled"
    shutil.copytree(model_dir, checkpoint)
    edit_json(checkpoint / "config.json", rope_scaling={"rope_type": "yarn", "factor": 4.0})
    assert_one_line_error(run_cli("export", "--checkpoint", checkpoint, "--out", tmp_path / "out"),
                          "cannot reproduce rope_scaling")
    assert not (tmp_path / "out").exists()


def test_export_verifies_every_variant(exported):
    out, _ = exported
    manifest = json.loads((out / "manifest.json").read_text())
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


def test_engine_encodes_as_sentence_transformers_with_prompts(st_dir, exported):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(st_dir), device="cpu")
    engine = Engine.from_directory(exported[0])
    for prompt_name in (None, "query"):
        expected = model.encode(TEXTS, prompt_name=prompt_name)
        encoded = engine.encode(TEXTS, prompt_name=prompt_name)
        assert cosines(encoded.embeddings, expected).min() >= 0.99999, prompt_name
        assert np.abs(encoded.embeddings - expected).max() <= 1e-5, prompt_name
    assert engine.encode(TEXTS).truncated.tolist() == [False] * 4 + [True, False]
    int8 = Engine.from_directory(exported[0], EngineConfig(precision="int8")).encode(TEXTS)
    assert cosines(int8.embeddings, model.encode(TEXTS)).min() >= 0.99


def test_engine_attention_maps_over_padding(exported):
    engine = Engine.from_directory(exported[0], attention=True)
    inputs = engine.tokenizer.encode_texts(["x", TEXTS[4]])  # 3 tokens and 40
    out = engine.run(inputs, attention=True)
    assert out.attentions is not None and out.attentions.shape == (4, 2, 4, 40, 40)
    np.testing.assert_allclose(out.attentions.sum(-1), 1.0, atol=1e-5)
    assert np.count_nonzero(out.attentions[:, 0, :, :, len(inputs[0]):]) == 0
