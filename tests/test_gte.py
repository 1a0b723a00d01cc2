"""GTE v1.5 (model/gte.py) against transformers' GteModel and sentence-transformers, on tiny random-weight
checkpoints saved by transformers itself (tiny_gte.py: 3 layers, hidden 64, 4 heads, no token types as
gte-base-en-v1.5), with gte-base-en-v1.5's pipeline: CLS pooling and Normalize. NTK-scaled rotary positions
(the published configs' rope_scaling) are checked against transformers' GteModel given Alibaba's frequencies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnserve.engine.engine import Engine
from attnserve.errors import CheckpointError
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.rotary_bert import RotaryBertEncoder

from .checkpoints import edit_json, save_pipeline
from .conftest import assert_one_line_error, run_cli
from .family_parity import (
    cosines,
    export,
    load_ours,
    max_error,
    padded_batch_with_types,
    refusal_before_weights_load,
    transformers_model,
)
from .tiny_gte import alibaba_ntk_inv_freq, save_tiny_gte

MAX_SEQ_LENGTH = 48
PROMPTS = {"query": "query: "}
LENGTHS = [(1,), (5, 3), (16, 9, 1), (48, 17, 33), (100, 64, 7, 100)]
TEXTS = ["hello world", "A LONGER sentence, with punctuation!", "cafe uber naive", "x",
         "the quick brown fox jumps over the lazy dog " * 6, "   spaced    out [MASK] text\t\ttabs  "]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_gte(tmp_path_factory.mktemp("gte") / "model")


@pytest.fixture(scope="module")
def st_dir(model_dir, tmp_path_factory) -> Path:
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    return save_pipeline(model_dir, tmp_path_factory.mktemp("gte") / "st",
                         lambda size: [Pooling(size, "cls"), Normalize()], max_seq_length=MAX_SEQ_LENGTH,
                         prompts=PROMPTS)


@pytest.fixture(scope="module")
def ours(model_dir) -> RotaryBertEncoder:
    return load_ours(model_dir, RotaryBertEncoder)


@pytest.fixture(scope="module")
def exported(st_dir, tmp_path_factory) -> Path:
    return export(st_dir, tmp_path_factory.mktemp("gte") / "artifacts")[0]


def test_config_is_read_as_transformers_reads_it(model_dir, ours):
    import transformers

    theirs = transformers.AutoConfig.from_pretrained(str(model_dir))
    cfg = ours.config
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size, cfg.type_vocab_size) == (
        theirs.hidden_size, theirs.num_hidden_layers, theirs.num_attention_heads, theirs.intermediate_size, 0)
    assert (cfg.rope_theta, cfg.ntk_factor, cfg.activation) == (theirs.rope_parameters["rope_theta"], 1.0, "gelu")
    assert not cfg.has_token_types and (cfg.qkv_bias, cfg.out_bias, cfg.up_bias, cfg.down_bias) == (
        True, True, False, True)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_last_hidden_state_matches_transformers(model_dir, ours, implementation):
    reference = transformers_model(model_dir, implementation)
    for seed, lengths in enumerate(LENGTHS):
        ids, mask, _ = padded_batch_with_types(lengths, ours.config.vocab_size, seed)
        with torch.no_grad():
            got, _ = ours(ids, mask)
            want = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        assert max_error(got, want, mask) <= 1e-4, lengths


@pytest.mark.parametrize("type_vocab_size", [1, 2])
def test_token_types_as_transformers_adds_them(tmp_path, type_vocab_size):
    """One type (gte-multilingual-base): its row is added to every token, and the graphs take no token types;
    two: the graphs take them, and they matter."""
    model = save_tiny_gte(tmp_path / "typed", seed=1, type_vocab_size=type_vocab_size)
    encoder = load_encoder(read_checkpoint(model))
    assert encoder.config.has_token_types == (type_vocab_size == 2)
    ids, mask, types = padded_batch_with_types((30, 11), encoder.config.vocab_size, seed=0)
    types = types if type_vocab_size == 2 else None
    with torch.no_grad():
        got, _ = encoder(ids, mask, token_type_ids=types)
        want = transformers_model(model, "eager")(input_ids=ids, attention_mask=mask,
                                                  token_type_ids=types).last_hidden_state
        untyped, _ = encoder(ids, mask)
    assert max_error(got, want, mask) <= 1e-4
    if type_vocab_size == 2:
        assert max_error(got, untyped, mask) > 0.05


@pytest.mark.parametrize("form", ["rope_scaling", "rope_parameters"])
def test_ntk_scaled_rotary_matches_transformers_given_alibabas_frequencies(model_dir, tmp_path, form):
    """The published form (rope_theta with rope_scaling {"type": "ntk"}) and transformers 5's (rope_parameters with
    rope_type "ntk"). transformers has no "ntk" rope type, so its GteModel gets Alibaba's frequencies by hand."""
    scaled = tmp_path / "scaled"
    shutil.copytree(model_dir, scaled)
    if form == "rope_scaling":
        edit_json(scaled / "config.json", rope_parameters=None, rope_theta=500_000.0,
                  rope_scaling={"type": "ntk", "factor": 2.0})
    else:
        edit_json(scaled / "config.json", rope_parameters={"rope_type": "ntk", "rope_theta": 500_000.0, "factor": 2.0})
    encoder = load_encoder(read_checkpoint(scaled))
    assert (encoder.config.rope_theta, encoder.config.ntk_factor) == (500_000.0, 2.0)
    reference = transformers_model(model_dir, "eager")
    reference.rotary_emb.inv_freq.copy_(alibaba_ntk_inv_freq(16, 500_000.0, 2.0))
    unscaled = tmp_path / "unscaled"
    shutil.copytree(model_dir, unscaled)
    edit_json(unscaled / "config.json", rope_parameters={"rope_type": "default", "rope_theta": 500_000.0})
    plain = load_encoder(read_checkpoint(unscaled))
    ids, mask, _ = padded_batch_with_types((100, 64, 7), encoder.config.vocab_size, seed=5)
    with torch.no_grad():
        got, _ = encoder(ids, mask)
        want = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        without_scaling, _ = plain(ids, mask)
    assert max_error(got, want, mask) <= 1e-4
    assert max_error(got, without_scaling, mask) > 0.05  # the scaling matters


def test_attention_maps_match_transformers_and_give_padding_nothing(model_dir, ours):
    reference = transformers_model(model_dir, "eager")
    ids, mask, _ = padded_batch_with_types((40, 17, 1), ours.config.vocab_size, seed=3)
    with torch.no_grad():
        _, got = ours(ids, mask, output_attentions=True)  # (L, B, nh, T, T)
        want = torch.stack(reference(input_ids=ids, attention_mask=mask, output_attentions=True).attentions)
    assert got is not None and got.shape == (3, 3, 4, 40, 40)
    real = mask.bool()
    rows = (real[:, None, :, None] & real[:, None, None, :]).expand(3, -1, 4, -1, -1)
    assert float((got - want).abs()[rows].max()) <= 1e-5
    torch.testing.assert_close(got.sum(-1), torch.ones(3, 3, 4, 40))
    assert torch.count_nonzero(got[:, ~real[:, None, None, :].expand(-1, 4, 40, -1)]) == 0
    assert float(got[:, 0].max()) > 0.5  # the random weights make attention peaked, not uniform


def test_masked_lm_checkpoint_loads_its_encoder_and_a_classifier_is_refused(tmp_path):
    masked = save_tiny_gte(tmp_path / "mlm", model_class="GteForMaskedLM", seed=1)
    encoder = load_encoder(read_checkpoint(masked))  # keys under "gte.", lm_head.* unused
    ids, mask, _ = padded_batch_with_types((12, 7), encoder.config.vocab_size, seed=0)
    with torch.no_grad():
        got, _ = encoder(ids, mask)
        want = transformers_model(masked, "eager")(input_ids=ids, attention_mask=mask).last_hidden_state
    assert max_error(got, want, mask) <= 1e-4
    classifier = save_tiny_gte(tmp_path / "cls", model_class="GteForSequenceClassification")
    with pytest.raises(CheckpointError, match="cannot reproduce architecture GteForSequenceClassification"):
        read_checkpoint(classifier)


REFUSED = [
    ({"rope_parameters": None, "rope_scaling": {"type": "ntk", "factor": 2.0, "mixed_b": 0.5}},
     "cannot reproduce rope settings"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "cannot reproduce rope settings"),
    ({"rope_parameters": {"rope_type": "ntk", "rope_theta": 1e4}}, "rope_type 'ntk' needs a factor"),
    ({"rope_scaling": {"type": "ntk", "factor": 2.0}}, "give rope_parameters or rope_scaling, not both"),
    ({"rope_parameters": {"rope_type": "ntk", "rope_theta": 1e4, "factor": 0.5}}, "ntk factor must be at least 1"),
    ({"layer_norm_type": "rms_norm"}, "cannot reproduce layer_norm_type 'rms_norm' (only 'layer_norm')"),
    ({"logn_attention_scale": True}, "cannot reproduce logn_attention_scale True (only False)"),
    ({"logn_attention_clip1": True}, "cannot reproduce logn_attention_clip1 True (only False)"),
    ({"pack_qkv": False}, "cannot reproduce pack_qkv False (only True)"),
    ({"position_embedding_type": "absolute"}, "cannot reproduce position_embedding_type 'absolute' (only 'rope')"),
    ({"hidden_act": "tanh"}, "hidden_act 'tanh' is not supported"),
    ({"architectures": ["GteForTokenClassification"]}, "cannot reproduce architecture GteForTokenClassification"),
]


@pytest.mark.parametrize("change, fragment", REFUSED, ids=[f"{'-'.join(c)}{i}" for i, (c, _) in enumerate(REFUSED)])
def test_settings_the_export_cannot_run_are_refused_before_weights_load(model_dir, tmp_path, change, fragment):
    message = refusal_before_weights_load(model_dir, tmp_path / "refused", change)
    assert fragment in message and "\n" not in message


def test_export_refuses_in_one_line(model_dir, tmp_path):
    checkpoint = tmp_path / "logn"
    shutil.copytree(model_dir, checkpoint)
    edit_json(checkpoint / "config.json", logn_attention_scale=True)
    assert_one_line_error(run_cli("export", "--checkpoint", checkpoint, "--out", tmp_path / "out"),
                          "cannot reproduce logn_attention_scale True")
    assert not (tmp_path / "out").exists()


def test_export_verifies_every_variant(exported):
    manifest = json.loads((exported / "manifest.json").read_text())
    assert manifest["pooling"] == "cls"
    for name in ("embeddings", "embeddings_fused", "attention"):
        assert manifest["variants"][name]["parity"]["max_abs_last_hidden_state"] <= 1e-4, name
    assert manifest["variants"]["attention"]["parity"]["max_padded_key_weight"] == 0
    assert manifest["variants"]["embeddings_fp16"]["parity"]["min_cosine_sentence_embedding"] >= 0.999
    assert manifest["variants"]["embeddings_int8"]["parity"]["mean_cosine_sentence_embedding_texts"] >= 0.99


def test_exported_fp32_graphs_match_pytorch_at_unseen_sizes(exported, ours):
    """Batch 5 and 37 tokens: sizes the graphs were neither traced nor verified at here."""
    import onnxruntime as ort

    ids, mask, _ = padded_batch_with_types((37, 20, 3, 37, 11), ours.config.vocab_size, seed=7)
    with torch.no_grad():
        want, want_attentions = ours(ids, mask, output_attentions=True)
    manifest = json.loads((exported / "manifest.json").read_text())
    fp32 = [name for name, v in manifest["variants"].items() if v["precision"] == "fp32"]
    assert {"embeddings", "embeddings_fused", "attention"} <= set(fp32)
    for name in fp32:
        session = ort.InferenceSession(str(exported / manifest["variants"][name]["file"]),
                                       providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]  # no token types
        outputs = dict(zip([o.name for o in session.get_outputs()],
                           session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}), strict=True))
        assert max_error(torch.from_numpy(outputs["last_hidden_state"]), want, mask) <= 1e-4, name
        if "attentions" in outputs:
            assert np.abs(outputs["attentions"] - want_attentions.numpy()).max() <= 1e-5


def test_engine_encodes_as_sentence_transformers(st_dir, exported):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(st_dir), device="cpu")
    engine = Engine.from_directory(exported)
    for prompt_name in (None, "query"):
        expected = model.encode(TEXTS, prompt_name=prompt_name)
        encoded = engine.encode(TEXTS, prompt_name=prompt_name)
        assert cosines(encoded.embeddings, expected).min() >= 0.99999, prompt_name
        assert np.abs(encoded.embeddings - expected).max() <= 1e-5, prompt_name


def test_served_with_a_prompt_as_sentence_transformers(st_dir, exported, tmp_path):
    """A real `attnserve serve` over the artifacts: Embed over gRPC with a prompt by name."""
    from sentence_transformers import SentenceTransformer

    from attnserve.client.client import make_request, to_result

    from .serving import ServerProcess

    expected = SentenceTransformer(str(st_dir), device="cpu").encode(TEXTS[:3], prompt_name="query")
    server = ServerProcess(exported, log_path=tmp_path / "server.log")
    try:
        server.wait_serving()
        with server.channel() as channel:
            reply = server.stub(channel).Embed(make_request(TEXTS[:3], truncate=True, prompt_name="query"), timeout=60)
    finally:
        assert server.terminate() == 0, server.log_tail()
    got = np.stack([to_result(e).sentence_embedding for e in reply.embeddings])
    assert cosines(got, expected).min() >= 0.99999
