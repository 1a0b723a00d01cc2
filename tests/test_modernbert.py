"""ModernBERT (model/modernbert.py) against transformers' ModernBertModel and sentence-transformers, on a tiny
random-weight checkpoint saved by transformers itself: 4 layers, hidden 64, layers 0 and 3 global, 1 and 2 local
with a window of 8 (4 keys either side), so that texts of 16 tokens and more really use the local attention."""

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
from attnserve.model.modernbert import GLOBAL, LOCAL, ModernBertEncoder

from .checkpoints import edit_json, save_sentence_transformer, save_tiny_modernbert
from .conftest import assert_one_line_error, run_cli
from .family_parity import LENGTHS, cosines, export, load_ours, padded_batch, transformers_model

MAX_SEQ_LENGTH = 40
TEXTS = ["hello world", "A LONGER sentence, with punctuation!", "café über naïve 42", "x",
         "the quick brown fox jumps over the lazy dog " * 12, "   spaced    out [MASK] text\t\ttabs  ",
         "東京は日本の首都です。🙂🚀 and some more words after it, enough for the local window"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_modernbert(tmp_path_factory.mktemp("modernbert") / "model")


@pytest.fixture(scope="module")
def st_dir(model_dir, tmp_path_factory) -> Path:
    return save_sentence_transformer(model_dir, tmp_path_factory.mktemp("modernbert") / "st", "mean",
                                     normalize=True, max_seq_length=MAX_SEQ_LENGTH)


@pytest.fixture(scope="module")
def ours(model_dir) -> ModernBertEncoder:
    return load_ours(model_dir, ModernBertEncoder)


@pytest.fixture(scope="module")
def exported(st_dir, tmp_path_factory) -> tuple[Path, list[str]]:
    return export(st_dir, tmp_path_factory.mktemp("modernbert") / "artifacts")


def test_config_is_read_as_transformers_reads_it(model_dir, ours):
    cfg = ours.config
    assert cfg.layer_types == (GLOBAL, LOCAL, LOCAL, GLOBAL)
    assert (cfg.half_window, cfg.global_rope_theta, cfg.local_rope_theta) == (4, 1000.0, 100.0)
    assert (cfg.norm_bias, cfg.attention_bias, cfg.mlp_bias) == (False, False, False)
    # The transformers 4.x form of the same settings (no layer_types, no rope_parameters) reads the same,
    # here and in transformers.
    import transformers

    from attnserve.model.modernbert import read_config

    legacy = json.loads((model_dir / "config.json").read_text())
    del legacy["layer_types"], legacy["rope_parameters"]
    legacy |= {"global_rope_theta": 1000.0, "local_rope_theta": 100.0}
    assert read_config(legacy, model_dir / "config.json") == cfg
    theirs = transformers.ModernBertConfig.from_dict(legacy)
    assert tuple(theirs.layer_types) == cfg.layer_types and theirs.sliding_window == cfg.half_window
    assert [theirs.rope_parameters[t]["rope_theta"] for t in (GLOBAL, LOCAL)] == [1000.0, 100.0]


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_last_hidden_state_matches_transformers(model_dir, ours, implementation):
    reference = transformers_model(model_dir, implementation)
    for seed, lengths in enumerate(LENGTHS):
        ids, mask = padded_batch(lengths, ours.config.vocab_size, ours.config.pad_token_id, seed)
        with torch.no_grad():
            got, _ = ours(ids, mask)
            want = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        error = float((got - want).abs()[mask.bool()].max())  # real positions only
        assert error <= 1e-4, (lengths, error)


def test_the_local_window_matters(model_dir, ours):
    """The parity above would hold for a model that ignored the window; this one's outputs change without it."""
    unwindowed = ModernBertEncoder(dataclasses.replace(ours.config, local_attention=10_000))
    unwindowed.load_state_dict(ours.state_dict())
    ids, mask = padded_batch((40, 17), ours.config.vocab_size, ours.config.pad_token_id, seed=0)
    with torch.no_grad():
        windowed, _ = ours(ids, mask)
        everywhere, _ = unwindowed(ids, mask)
    assert float((windowed - everywhere).abs()[mask.bool()].max()) > 0.05


def test_attention_maps_match_transformers_and_give_padding_nothing(model_dir, ours):
    reference = transformers_model(model_dir, "eager")
    ids, mask = padded_batch((40, 17, 1), ours.config.vocab_size, ours.config.pad_token_id, seed=3)
    with torch.no_grad():
        _, got = ours(ids, mask, output_attentions=True)  # (L, B, nh, T, T)
        want = torch.stack(reference(input_ids=ids, attention_mask=mask, output_attentions=True).attentions)
    assert got is not None and got.shape == (4, 3, 4, 40, 40)
    real = mask.bool()
    rows = (real[:, None, :, None] & real[:, None, None, :]).expand(4, -1, 4, -1, -1)
    assert float((got - want).abs()[rows].max()) <= 1e-5
    # From every query, padded ones included: padded keys get exactly 0.
    assert torch.count_nonzero(got[:, ~real[:, None, None, :].expand(-1, 4, 40, -1)]) == 0
    # In the local layers, a real query gives exactly 0 to keys more than 4 positions away.
    distance = (torch.arange(40)[None, :] - torch.arange(40)[:, None]).abs()
    local = got[1:3, 0]  # (2, nh, T, T), the 40-token row
    assert torch.count_nonzero(local[..., distance > 4]) == 0 and torch.count_nonzero(local[..., distance <= 4]) > 0


def test_masked_lm_checkpoint_loads_its_encoder_and_a_token_classifier_is_refused(tmp_path):
    masked = save_tiny_modernbert(tmp_path / "mlm", model_class="ModernBertForMaskedLM", seed=1)
    encoder = load_encoder(read_checkpoint(masked))  # keys under "model.", head.* and decoder.* unused
    ids, mask = padded_batch((12, 7), encoder.config.vocab_size, encoder.config.pad_token_id, seed=0)
    with torch.no_grad():
        got, _ = encoder(ids, mask)
        want = transformers_model(masked, "eager")(input_ids=ids, attention_mask=mask).last_hidden_state
    assert float((got - want).abs()[mask.bool()].max()) <= 1e-4

    # A sequence classifier is a cross-encoder (tests/test_cross_encoder_families.py); a token classifier's head
    # is refused, by its architecture and, with that hidden, by its weights.
    classifier = save_tiny_modernbert(tmp_path / "cls", model_class="ModernBertForSequenceClassification")
    assert read_checkpoint(classifier).kind == "reranker"
    tagger = save_tiny_modernbert(tmp_path / "tok", model_class="ModernBertForTokenClassification")
    with pytest.raises(CheckpointError, match="cannot reproduce architecture ModernBertForTokenClassification"):
        read_checkpoint(tagger)
    edit_json(tagger / "config.json", architectures=["ModernBertModel"])  # the head's weights still say so
    with pytest.raises(CheckpointError, match=r"cannot reproduce the head classifier\.\*"):
        read_checkpoint(tagger)


def test_biases_where_the_config_asks_for_them(tmp_path):
    model = save_tiny_modernbert(tmp_path / "biased", seed=2, norm_bias=True, attention_bias=True, mlp_bias=True)
    encoder = load_encoder(read_checkpoint(model))
    assert sum(name.endswith(".bias") for name, _ in encoder.named_parameters()) == 2 + 4 * 6 - 1  # layer 0: no norm
    ids, mask = padded_batch((30, 11), encoder.config.vocab_size, encoder.config.pad_token_id, seed=0)
    with torch.no_grad():
        got, _ = encoder(ids, mask)
        want = transformers_model(model, "eager")(input_ids=ids, attention_mask=mask).last_hidden_state
    assert float((got - want).abs()[mask.bool()].max()) <= 1e-4


def test_export_refuses_in_one_line(model_dir, tmp_path):
    checkpoint = tmp_path / "scaled"
    shutil.copytree(model_dir, checkpoint)
    edit_json(checkpoint / "config.json", rope_scaling={"rope_type": "yarn", "factor": 4.0})
    assert_one_line_error(run_cli("export", "--checkpoint", checkpoint, "--out", tmp_path / "out"),
                          "cannot reproduce rope_scaling")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, fragment", [
    ({"hidden_activation": "silu"}, "hidden_activation 'silu' is not supported"),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0}}},
     "cannot reproduce rope_parameters['full_attention']"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "cannot reproduce rope_scaling"),
    ({"layer_types": ["full_attention"]}, "layer_types must list"),
    ({"mlp_bias": "yes"}, "mlp_bias must be true or false"),
])
def test_config_settings_the_export_cannot_run_are_refused(model_dir, tmp_path, change, fragment):
    config = tmp_path / "config.json"
    config.write_text((model_dir / "config.json").read_text())
    edit_json(config, **change)
    from attnserve.model.modernbert import read_config

    with pytest.raises(CheckpointError, match=fragment.replace("[", r"\[").replace("]", r"\]")) as refused:
        read_config(json.loads(config.read_text()), config)
    assert "\n" not in str(refused.value)


def test_export_verifies_every_variant_and_says_attention_is_unfused(exported):
    out, lines = exported
    # What the optimizer fused, said as what it is, not as "0 Attention nodes" (which read as a failure).
    assert any(line.startswith("embeddings_fused.onnx: 4 Gelu") and "fuses no attention of this family" in line
               for line in lines), lines
    assert not any("0 Attention nodes" in line for line in lines), lines
    manifest = json.loads((out / "manifest.json").read_text())
    assert {name: v["fused"] for name, v in manifest["variants"].items()} == {
        "embeddings": False, "embeddings_fused": False, "embeddings_int8": False,
        "embeddings_int8_skip_layer_norm": False, "embeddings_fp16": False, "attention": False,
        "attention_last": False}
    for name in ("embeddings", "embeddings_fused", "attention", "attention_last"):
        assert manifest["variants"][name]["parity"]["max_abs_last_hidden_state"] <= 1e-4
    assert manifest["variants"]["attention"]["parity"]["max_padded_key_weight"] == 0
    # local layers' out-of-window keys weigh 0 as padded ones do: rollout's real block is exact all the same
    assert manifest["variants"]["attention_last"]["parity"]["max_padded_key_weight"] == 0
    assert manifest["variants"]["attention_last"]["parity"]["max_abs_rollout"] <= 1e-4
    assert manifest["variants"]["embeddings_fp16"]["parity"]["min_cosine_sentence_embedding"] >= 0.999
    assert manifest["variants"]["embeddings_int8"]["parity"]["mean_cosine_sentence_embedding_texts"] >= 0.99
    assert "token_type_ids" not in {i.name for i in __import__("onnx").load(
        str(out / "embeddings.onnx"), load_external_data=False).graph.input}


def test_engine_encodes_as_sentence_transformers(st_dir, exported):
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(st_dir), device="cpu").encode(TEXTS)
    encoded = Engine.from_directory(exported[0]).encode(TEXTS)
    assert encoded.truncated.tolist() == [False] * 4 + [True, False, True]  # CJK and emoji: several tokens each
    assert cosines(encoded.embeddings, expected).min() >= 0.99999
    assert np.abs(encoded.embeddings - expected).max() <= 1e-5
    int8 = Engine.from_directory(exported[0], EngineConfig(precision="int8")).encode(TEXTS)
    assert cosines(int8.embeddings, expected).min() >= 0.99


def test_engine_attention_maps_over_padding(exported):
    engine = Engine.from_directory(exported[0], attention=True)
    inputs = engine.tokenizer.encode_texts(["x", TEXTS[4]])  # 3 tokens and 40
    out = engine.run(inputs, attention=True)
    assert out.attentions is not None and out.attentions.shape == (4, 2, 4, 40, 40)
    np.testing.assert_allclose(out.attentions.sum(-1), 1.0, atol=1e-5)
    assert np.count_nonzero(out.attentions[:, 0, :, :, len(inputs[0]):]) == 0
    distance = np.abs(np.arange(40)[None, :] - np.arange(40)[:, None])
    assert np.count_nonzero(out.attentions[1:3, 1][..., distance > 4]) == 0


def test_served_with_attention_maps_like_bert(exported, tmp_path):
    """A real `attnserve serve` over the ModernBERT artifacts: the offline engine's embeddings, and attention maps
    (the same weights as the verified attention graph) labelled with the byte-level BPE's tokens."""
    from attnserve.client.client import make_request, to_result

    from .serving import ServerProcess

    engine = Engine.from_directory(exported[0], attention=True)
    server = ServerProcess(exported[0], log_path=tmp_path / "server.log")
    try:
        server.wait_serving()
        with server.channel() as channel:
            request = make_request(TEXTS[-2:], attention_layers=[0, 1, -1], truncate=True)
            reply = server.stub(channel).Embed(request, timeout=60)
        results = [to_result(e) for e in reply.embeddings]
    finally:
        assert server.terminate() == 0, server.log_tail()
    np.testing.assert_allclose(np.stack([r.sentence_embedding for r in results]),
                               engine.encode(TEXTS[-2:]).embeddings, atol=2e-6)
    for text, result in zip(TEXTS[-2:], results, strict=True):
        inputs = engine.tokenizer.encode_texts([text])
        reference = engine.run(inputs, attention=True).attentions[:, 0]  # (L, nh, T, T)
        T = len(inputs[0])
        assert result.attentions.shape == (3, 4, T, T) and len(result.tokens) == T
        assert result.tokens[0] == "[CLS]" and result.tokens[-1] == "[SEP]"
        np.testing.assert_allclose(result.attentions, reference[[0, 1, 3]], atol=1e-5)
