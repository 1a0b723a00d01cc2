"""Cross-encoders exported as rerankers: the manifest says so, every graph was verified with real token types,
and the scores equal sentence-transformers' CrossEncoder over the same checkpoint folder."""

from __future__ import annotations

import numpy as np
import pytest

from attnserve.engine.engine import Engine
from attnserve.engine.manifest import load_manifest
from attnserve.errors import ConfigError
from attnserve.export.reranker import SCORE_TOLERANCE

PAIRS = [
    ("how tall is the eiffel tower", "The Eiffel Tower is 330 metres tall."),
    ("how tall is the eiffel tower", "Paris is the capital of France."),
    ("what do cats eat", "Cats are obligate carnivores and eat meat."),
    ("what do cats eat", "The stock market fell on Monday."),
    ("a", "b"),
    ("Ünïcödé naïve café?", "東京は日本の首都です。"),
    ("long query " * 40, "a long document that the pair's truncation cuts, longest side first " * 20),
]


@pytest.fixture(scope="module")
def cross_encoder(cross_encoder_dir):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(cross_encoder_dir), device="cpu")


def test_manifest_names_a_reranker(reranker_artifacts):
    manifest = load_manifest(reranker_artifacts)
    assert (manifest.kind, manifest.num_labels, manifest.score_activation) == ("reranker", 1, "sigmoid")
    # int8 where its scores reach the bar (export/reranker_int8.py); this model's weights are drawn 25x wider than
    # transformers' initialisation, which int8 does not keep to the bar.
    assert {"scores", "scores_fused", "scores_fp16", "attention"} <= set(manifest.variants)
    assert set(manifest.variants) - {"scores_int8", "scores_int8_skip_layer_norm"} == {
        "scores", "scores_fused", "scores_fp16", "attention"}
    for variant in manifest.variants.values():
        assert variant.outputs[0] == "scores"
        assert all(t.holds(variant.parity[t.metric]) for t in SCORE_TOLERANCE[variant.precision])
        assert variant.parity["pairs_checked"] == 256


@pytest.mark.parametrize("precision", ["fp32"])
def test_scores_match_cross_encoder(reranker_artifacts, cross_encoder, precision):
    import torch

    from attnserve.config import EngineConfig
    from attnserve.engine.scores import SCORE_ACTIVATIONS

    engine = Engine.from_directory(reranker_artifacts, EngineConfig(provider="cpu", precision=precision))
    logits = engine.score_tokenized(engine.tokenizer.encode_pairs(PAIRS))[:, 0]  # (N,)
    want_logits = cross_encoder.predict(PAIRS, activation_fn=torch.nn.Identity())
    want = cross_encoder.predict(PAIRS)  # its own activation: a sigmoid for one label
    assert np.abs(logits - want_logits).max() <= 1e-5
    assert np.abs(SCORE_ACTIVATIONS["sigmoid"](logits) - want).max() <= 1e-5
    assert want.max() - want.min() > 0.1  # the scores really differ, so that the order is tested


def test_attention_graph_shows_both_segments(reranker_artifacts):
    engine = Engine.from_directory(reranker_artifacts, attention=True)
    pair = engine.tokenizer.encode_pairs([("what do cats eat", "meat")])[0]
    out = engine.run([pair], attention=True)
    tokens = engine.tokenizer.tokens(pair.ids)
    assert tokens == ["[CLS]", "what", "do", "cats", "eat", "[SEP]", "meat", "[SEP]"] and pair.pair_start == 6
    assert out.attentions.shape == (2, 1, 2, 8, 8)  # (L, B, nh, T, T): both segments' tokens
    assert np.allclose(out.attentions.sum(-1), 1, atol=1e-5)
    assert np.abs(out.scores - engine.score_tokenized([pair])).max() <= 1e-5


def test_int8_is_served_or_refused_in_one_line(reranker_artifacts):
    """int8 runs where the export wrote it; where its scores missed the bar, asking for it says so."""
    from attnserve.config import EngineConfig

    config = EngineConfig(provider="cpu", precision="int8")
    if "scores_int8" in load_manifest(reranker_artifacts).variants:
        assert Engine.from_directory(reranker_artifacts, config).precision == "int8"
        return
    with pytest.raises(ConfigError, match="has no int8 graph: its int8 scores missed the export's bar"):
        Engine.from_directory(reranker_artifacts, config)


def test_pair_embeddings_use_token_types(artifacts, encoder):
    """A pair through an embedder: with a graph that takes token_type_ids (helper fam adds the input), equal to
    the PyTorch encoder fed the same types; with one that does not, refused, never encoded as one segment."""
    import torch

    from attnserve.engine.batching import pad, pad_types
    from attnserve.model.pooling import pool

    engine = Engine.from_directory(artifacts)
    pairs = engine.tokenizer.encode_pairs(PAIRS)
    if not engine.takes_token_types:
        with pytest.raises(ValueError, match="takes no token_type_ids"):
            engine.encode_tokenized(pairs)
        return
    got = engine.encode_tokenized(pairs, normalize=False).embeddings
    ids, mask = pad([x.ids for x in pairs])
    types = pad_types([x.type_ids for x in pairs], ids.shape[1])
    with torch.no_grad():
        hidden, _ = encoder(torch.from_numpy(ids), torch.from_numpy(mask), token_type_ids=torch.from_numpy(types))
        want = pool(hidden, torch.from_numpy(mask), engine.manifest.pooling).numpy()
    assert np.abs(got - want).max() <= 1e-4


def test_encoding_with_a_reranker_is_refused_in_one_line(reranker_artifacts, tmp_path):
    from tests.conftest import assert_one_line_error, run_cli

    (tmp_path / "in.txt").write_text("hello\nworld\n", encoding="utf-8")
    result = run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "out.parquet", "--artifacts", reranker_artifacts)
    assert_one_line_error(result, "tiny-reranker is a reranker", "no embeddings")
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize("file,changes,fragment", [
    ("config_sentence_transformers.json", {"activation_fn": "torch.nn.modules.activation.Tanh"},
     "activation 'torch.nn.modules.activation.Tanh'"),
    ("config_sentence_transformers.json", {"activation_fn": "my_package.Scale"}, "activation 'my_package.Scale'"),
    ("config_sentence_transformers.json", {"prompts": {"q": "query: "}, "default_prompt_name": "q"},
     "default_prompt_name 'q'"),
    ("sentence_bert_config.json", {"transformer_task": "feature-extraction"}, "transformer_task"),
    ("sentence_bert_config.json", {"max_seq_length": 32}, None),
    # As for embedders (model/pipeline.py): sentence-transformers' own test looks for a Lowercase normalizer.
    ("sentence_bert_config.json", {"do_lower_case": True}, "do_lower_case true"),
    ("sentence_bert_config.json", {"max_seq_length": 65}, "max_seq_length 65"),
    ("modules.json", None, "one Transformer module"),
], ids=["tanh", "untrusted class", "default prompt", "feature extraction", "max_seq_length", "do_lower_case",
        "too long", "pooling"])
def test_cross_encoder_settings_are_read_or_refused(cross_encoder_dir, tmp_path, file, changes, fragment):
    import json

    from attnserve.errors import CheckpointError
    from attnserve.model.checkpoint import read_checkpoint
    from tests.checkpoints import copy_checkpoint, edit_json

    ckpt = copy_checkpoint(cross_encoder_dir, tmp_path / "ckpt")
    if changes is None:  # a pooled pipeline over the classifier
        (ckpt / file).write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    else:
        edit_json(ckpt / file, **changes)
    if fragment is None:
        assert read_checkpoint(ckpt).max_seq_length == 32
        return
    with pytest.raises(CheckpointError, match="cannot reproduce") as caught:
        read_checkpoint(ckpt)
    assert fragment in str(caught.value)
