"""Qwen3 (model/qwen3.py) against transformers' Qwen3Model and sentence-transformers, on a tiny random-weight
checkpoint saved by transformers itself (tiny_qwen3.py): 3 layers, hidden 64, 4 query heads sharing 2 key/value
heads of head_dim 32 (not 64 / 4), causal attention, and Qwen3-Embedding's pipeline (lasttoken pooling,
Normalize, the model card's prompts, "<|endoftext|>" appended, padding on the left)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnserve.engine.engine import Engine
from attnserve.engine.session import open_session
from attnserve.errors import CheckpointError
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.pooling import pool
from attnserve.model.qwen3 import Qwen3Encoder, read_config

from .checkpoints import edit_json
from .conftest import assert_one_line_error, run_cli
from .family_parity import LENGTHS, cosines, export, load_ours, padded_batch, transformers_model
from .tiny_qwen3 import END_OF_TEXT, PROMPTS, save_qwen3_embedding, save_tiny_qwen3

MAX_SEQ_LENGTH = 40
TEXTS = ["hello world", "A LONGER sentence, with punctuation!", "café über naïve 42", "x",
         "the quick brown fox jumps over the lazy dog " * 12, "   spaced    out text\t\ttabs  ",
         "東京は日本の首都です。🙂🚀 and some more words after it"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_qwen3(tmp_path_factory.mktemp("qwen3") / "model")


@pytest.fixture(scope="module")
def st_dir(model_dir, tmp_path_factory) -> Path:
    return save_qwen3_embedding(model_dir, tmp_path_factory.mktemp("qwen3") / "st", max_seq_length=MAX_SEQ_LENGTH)


@pytest.fixture(scope="module")
def ours(model_dir) -> Qwen3Encoder:
    return load_ours(model_dir, Qwen3Encoder)


@pytest.fixture(scope="module")
def exported(st_dir, tmp_path_factory) -> tuple[Path, list[str]]:
    return export(st_dir, tmp_path_factory.mktemp("qwen3") / "artifacts")


def test_config_is_read_as_transformers_reads_it(model_dir, ours):
    cfg = ours.config
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_size, cfg.hidden_size) == (4, 2, 32, 64)
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.attention_bias, cfg.hidden_act) == (1000.0, 1e-6, False, "silu")
    # The transformers 4.x form (rope_theta at the top, no rope_parameters or layer_types), as Qwen3-Embedding's
    # config.json has it, reads the same, here and in transformers.
    import transformers

    legacy = json.loads((model_dir / "config.json").read_text())
    del legacy["layer_types"], legacy["rope_parameters"]
    legacy |= {"rope_theta": 1000.0, "rope_scaling": None, "sliding_window": None, "use_sliding_window": False}
    assert read_config(legacy, model_dir / "config.json") == cfg
    assert transformers.Qwen3Config.from_dict(legacy).rope_parameters["rope_theta"] == 1000.0


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_last_hidden_state_matches_transformers(model_dir, ours, implementation, side):
    reference = transformers_model(model_dir, implementation)
    worst = 0.0
    for seed, lengths in enumerate(LENGTHS):
        ids, mask = padded_batch(lengths, ours.config.vocab_size, ours.config.pad_token_id, seed, side)
        with torch.no_grad():
            got, _ = ours(ids, mask)
            want = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        worst = max(worst, float((got - want).abs()[mask.bool()].max()))  # real positions only
    assert worst <= 1e-4, worst


def test_left_and_right_padding_give_the_same_real_outputs(ours):
    ids, right = padded_batch((40, 17, 1), ours.config.vocab_size, ours.config.pad_token_id, seed=4)
    # The same tokens with their padding moved before them.
    left_ids = torch.stack([torch.cat((row[~m.bool()], row[m.bool()])) for row, m in zip(ids, right, strict=True)])
    left = right.flip(1)
    with torch.no_grad():
        from_right, _ = ours(ids, right)
        from_left, _ = ours(left_ids, left)
    assert float((from_right[right.bool()] - from_left[left.bool()]).abs().max()) <= 1e-4
    for mode in ("lasttoken", "mean"):
        np.testing.assert_allclose(pool(from_right, right, mode), pool(from_left, left, mode), atol=1e-4)


@pytest.mark.parametrize("side", ["right", "left"])
def test_attention_maps_are_causal_per_query_head_and_give_padding_nothing(model_dir, ours, side):
    reference = transformers_model(model_dir, "eager")
    ids, mask = padded_batch((40, 17, 1), ours.config.vocab_size, ours.config.pad_token_id, seed=3, side=side)
    with torch.no_grad():
        _, got = ours(ids, mask, output_attentions=True)  # (L, B, nh, T, T)
        want = torch.stack(reference(input_ids=ids, attention_mask=mask, output_attentions=True).attentions)
    assert got is not None and got.shape == (3, 3, 4, 40, 40)  # one map per query head, not per key/value head
    real = mask.bool()
    rows = (real[:, None, :, None] & real[:, None, None, :]).expand(3, -1, 4, -1, -1)
    assert float((got - want).abs()[rows].max()) <= 1e-5
    torch.testing.assert_close(got.sum(-1), torch.ones(3, 3, 4, 40), atol=1e-5, rtol=0)
    # No real query sees a later key. With right padding (the engine's) no padded query does either; a padded
    # query before every real token (left padding) has only padded keys behind it and weighs later real ones.
    later = got.triu(diagonal=1)
    assert torch.count_nonzero(later if side == "right" else later[rows]) == 0
    # From every query, padded ones included: padded keys get exactly 0.
    assert torch.count_nonzero(got[:, ~real[:, None, None, :].expand(-1, 4, 40, -1)]) == 0
    # Query heads 0 and 1 share a key/value head but weigh its keys their own way.
    assert float((got[:, :, 0] - got[:, :, 1]).abs().max()) > 0.05


def test_lasttoken_pooling_matches_sentence_transformers_on_left_padding():
    from sentence_transformers.sentence_transformer.modules import Pooling

    hidden = torch.randn(3, 9, 16, generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([9, 4, 1])
    for mask in ((torch.arange(9)[None] < lengths[:, None]).long(), (torch.arange(9)[None] >= 9 - lengths[:, None])
                 .long()):
        theirs = Pooling(16, "lasttoken")({"token_embeddings": hidden, "attention_mask": mask})["sentence_embedding"]
        torch.testing.assert_close(pool(hidden, mask, "lasttoken"), theirs, atol=0, rtol=0)


def test_causal_lm_checkpoint_loads_its_encoder_and_biases_are_reproduced(tmp_path):
    """Qwen3ForCausalLM (keys under "model.", lm_head unused) as an encoder, and attention_bias true."""
    model = save_tiny_qwen3(tmp_path / "lm", model_class="Qwen3ForCausalLM", seed=1, attention_bias=True,
                            tie_word_embeddings=False)
    save_qwen3_embedding(model, tmp_path / "st")  # with its sentence-transformers modules: an embedder
    ckpt = read_checkpoint(tmp_path / "st")
    assert ckpt.kind == "embedder" and ckpt.modules == ["Transformer(qwen3)", "Pooling(lasttoken)", "Normalize"]
    encoder = load_encoder(ckpt)
    assert sum(name.endswith(".bias") for name, _ in encoder.named_parameters()) == 3 * 4
    ids, mask = padded_batch((30, 11), encoder.config.vocab_size, encoder.config.pad_token_id, seed=0, side="left")
    with torch.no_grad():
        got, _ = encoder(ids, mask)
        want = transformers_model(model, "sdpa")(input_ids=ids, attention_mask=mask).last_hidden_state
    assert float((got - want).abs()[mask.bool()].max()) <= 1e-4


@pytest.mark.parametrize("change, fragment", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "cannot reproduce rope_scaling"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0}},
     "cannot reproduce rope_parameters"),
    ({"use_sliding_window": True, "sliding_window": 8}, "cannot reproduce use_sliding_window true"),
    ({"layer_types": ["full_attention", "sliding_attention", "full_attention"]}, "cannot reproduce layer_types"),
    ({"use_bidirectional_attention": True}, "cannot reproduce bidirectional attention"),
    ({"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
    ({"attention_bias": "yes"}, "attention_bias must be true or false"),
    ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
    ({"architectures": ["Qwen3ForSequenceClassification"]},
     "cannot reproduce architecture Qwen3ForSequenceClassification"),
])
def test_config_settings_the_export_cannot_run_are_refused(model_dir, tmp_path, change, fragment):
    config = tmp_path / "config.json"
    config.write_text((model_dir / "config.json").read_text())
    edit_json(config, **change)
    with pytest.raises(CheckpointError, match=fragment.replace("[", r"\[").replace("]", r"\]")) as refused:
        read_config(json.loads(config.read_text()), config)
    assert "\n" not in str(refused.value)


def test_export_refuses_in_one_line_before_reading_weights(model_dir, tmp_path):
    checkpoint = tmp_path / "windowed"
    shutil.copytree(model_dir, checkpoint)
    edit_json(checkpoint / "config.json", use_sliding_window=True, sliding_window=8)
    (checkpoint / "model.safetensors").write_bytes(b"not weights")  # never opened: the config is refused first
    assert_one_line_error(run_cli("export", "--checkpoint", checkpoint, "--out", tmp_path / "out"),
                          "cannot reproduce use_sliding_window true")
    assert not (tmp_path / "out").exists()


def test_export_verifies_every_variant(exported):
    out, lines = exported
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["family"] == "qwen3" and manifest["pooling"] == "lasttoken" and manifest["normalize"]
    assert manifest["prompts"] == PROMPTS and manifest["num_heads"] == 4
    for name in ("embeddings", "embeddings_fused", "attention"):
        assert manifest["variants"][name]["parity"]["max_abs_last_hidden_state"] <= 1e-4
    assert manifest["variants"]["attention"]["parity"]["max_padded_key_weight"] == 0
    assert manifest["variants"]["embeddings_fp16"]["parity"]["min_cosine_sentence_embedding"] >= 0.999
    assert manifest["variants"]["embeddings_int8"]["parity"]["mean_cosine_sentence_embedding_texts"] >= 0.99


@pytest.mark.parametrize("side", ["right", "left"])
def test_every_fp32_graph_matches_pytorch_at_unseen_sizes(exported, ours, side):
    """Traced at (2, 8), right-padded; run here at other batch sizes and lengths, padded on either side."""
    out, _ = exported
    for file in ("embeddings.onnx", "embeddings_fused.onnx", "attention.onnx"):
        session = open_session(out / file, "CPUExecutionProvider")
        for seed, lengths in enumerate([(3,), (37, 12, 1), (40, 40, 5, 29, 17)]):
            ids, mask = padded_batch(lengths, ours.config.vocab_size, ours.config.pad_token_id, seed, side)
            outputs = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
            with torch.no_grad():
                hidden, attentions = ours(ids, mask, output_attentions=True)
            real = mask.bool().numpy()
            assert np.abs(outputs[0] - hidden.numpy())[real].max() <= 1e-4, (file, lengths)
            expected = pool(hidden, mask, "lasttoken").numpy()  # the graph's sentence embedding is not normalised
            assert np.abs(outputs[1] - expected).max() <= 1e-4, (file, lengths)
            if file == "attention.onnx":
                # Real queries' rows: a left-padded padded query's row is not an output anyone reads.
                rows = np.broadcast_to(real[None, :, None, :, None] & real[None, :, None, None, :], outputs[2].shape)
                assert np.abs(outputs[2] - attentions.numpy())[rows].max() <= 1e-5


def test_engine_encodes_as_sentence_transformers_with_the_prompts(st_dir, exported):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(st_dir), device="cpu")
    assert model.tokenizer.padding_side == "left" and model.prompts == PROMPTS
    engine = Engine.from_directory(exported[0])
    for prompt_name in ("query", "document", None):
        expected = model.encode(TEXTS, prompt_name=prompt_name)
        encoded = engine.encode(TEXTS, prompt_name=prompt_name)
        assert cosines(encoded.embeddings, expected).min() >= 0.99999, prompt_name
        assert np.abs(encoded.embeddings - expected).max() <= 1e-5, prompt_name
    # The query prompt reaches the model: it changes every embedding.
    queries, documents = engine.encode(TEXTS[:3], prompt_name="query"), engine.encode(TEXTS[:3])
    assert cosines(queries.embeddings, documents.embeddings).max() < 0.99
    # Every text ends in <|endoftext|>, whose hidden state is the embedding (a truncated text loses it, in
    # sentence-transformers too: both pool the last token kept).
    from tokenizers import Tokenizer

    end_of_text = Tokenizer.from_file(str(st_dir / "tokenizer.json")).token_to_id(END_OF_TEXT)
    assert engine.tokenizer.encode_texts(["hello world"])[0].ids[-1] == end_of_text
