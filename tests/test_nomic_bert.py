"""NomicBERT (model/nomic_bert.py) against transformers' NomicBertModel and sentence-transformers, on a tiny
random-weight checkpoint saved by transformers itself (tiny_nomic.py: 3 layers, hidden 64, 4 heads, two token
types), with nomic-embed-text's pipeline: mean pooling, Normalize, and its task prefixes as prompts."""

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
from .tiny_nomic import as_published, save_tiny_nomic

MAX_SEQ_LENGTH = 48
# nomic-embed-text-v1.5's task prefixes, as its model card asks for them.
PROMPTS = {"query": "search_query: ", "document": "search_document: ", "clustering": "clustering: ",
           "classification": "classification: "}
# Padded batches from 1 token to past max_seq_length; each row's length is its own.
LENGTHS = [(1,), (5, 3), (16, 9, 1), (48, 17, 33), (100, 64, 7, 100)]
TEXTS = ["hello world", "A LONGER sentence, with punctuation!", "cafe uber naive", "x",
         "the quick brown fox jumps over the lazy dog " * 6, "   spaced    out [MASK] text\t\ttabs  "]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_nomic(tmp_path_factory.mktemp("nomic") / "model")


@pytest.fixture(scope="module")
def st_dir(model_dir, tmp_path_factory) -> Path:
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    return save_pipeline(model_dir, tmp_path_factory.mktemp("nomic") / "st",
                         lambda size: [Pooling(size, "mean"), Normalize()], max_seq_length=MAX_SEQ_LENGTH,
                         prompts=PROMPTS)


@pytest.fixture(scope="module")
def ours(model_dir) -> RotaryBertEncoder:
    return load_ours(model_dir, RotaryBertEncoder)


@pytest.fixture(scope="module")
def exported(st_dir, tmp_path_factory) -> tuple[Path, list[str]]:
    return export(st_dir, tmp_path_factory.mktemp("nomic") / "artifacts")


def test_config_is_read_as_transformers_reads_it(model_dir, ours):
    import transformers

    theirs = transformers.AutoConfig.from_pretrained(str(model_dir))
    cfg = ours.config
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.head_size, cfg.intermediate_size) == (
        theirs.hidden_size, theirs.num_hidden_layers, theirs.num_attention_heads, theirs.head_dim,
        theirs.intermediate_size)
    assert (cfg.rope_theta, cfg.activation, cfg.type_vocab_size, cfg.layer_norm_eps) == (
        theirs.rope_parameters["rope_theta"], theirs.hidden_act, 2, theirs.layer_norm_eps)
    assert cfg.has_token_types and not (cfg.qkv_bias or cfg.out_bias or cfg.up_bias or cfg.down_bias)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_last_hidden_state_matches_transformers(model_dir, ours, implementation):
    reference = transformers_model(model_dir, implementation)
    for seed, lengths in enumerate(LENGTHS):
        ids, mask, types = padded_batch_with_types(lengths, ours.config.vocab_size, seed)
        with torch.no_grad():
            for token_types in (None, types):
                got, _ = ours(ids, mask, token_type_ids=token_types)
                want = reference(input_ids=ids, attention_mask=mask, token_type_ids=token_types).last_hidden_state
                assert max_error(got, want, mask) <= 1e-4, (lengths, token_types is None)


def test_token_types_and_rotary_positions_matter(ours):
    """The parity above would hold for a model that ignored segments or positions; this one's outputs change."""
    ids, mask, types = padded_batch_with_types((30,), ours.config.vocab_size, seed=0)
    with torch.no_grad():
        plain, _ = ours(ids, mask)
        segmented, _ = ours(ids, mask, token_type_ids=types)
        reversed_ids, _ = ours(ids.flip(1), mask)
    assert float((plain - segmented).abs().max()) > 0.05
    # Without positions, reversing the tokens would reverse the outputs.
    assert float((plain.flip(1) - reversed_ids).abs().max()) > 0.05


def test_published_config_naming_reads_the_same(model_dir, ours, tmp_path):
    """nomic-embed-text-v1.5's config.json uses the remote code's names (n_embd, rotary_emb_base, ...)."""
    published = tmp_path / "published"
    shutil.copytree(model_dir, published)
    as_published(published / "config.json")
    assert "n_embd" in json.loads((published / "config.json").read_text())
    assert read_checkpoint(published).config == ours.config
    edit_json(published / "config.json", rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, hidden_size=64)
    assert read_checkpoint(published).config == ours.config  # both namings, agreeing (rotary_emb_base 1000)
    edit_json(published / "config.json", hidden_size=32)
    with pytest.raises(CheckpointError, match="hidden_size 32 and n_embd 64 disagree"):
        read_checkpoint(published)


def test_attention_maps_match_transformers_and_give_padding_nothing(model_dir, ours):
    reference = transformers_model(model_dir, "eager")
    ids, mask, types = padded_batch_with_types((40, 17, 1), ours.config.vocab_size, seed=3)
    with torch.no_grad():
        _, got = ours(ids, mask, output_attentions=True, token_type_ids=types)  # (L, B, nh, T, T)
        want = torch.stack(reference(input_ids=ids, attention_mask=mask, token_type_ids=types,
                                     output_attentions=True).attentions)
    assert got is not None and got.shape == (3, 3, 4, 40, 40)
    real = mask.bool()
    rows = (real[:, None, :, None] & real[:, None, None, :]).expand(3, -1, 4, -1, -1)
    assert float((got - want).abs()[rows].max()) <= 1e-5
    torch.testing.assert_close(got.sum(-1), torch.ones(3, 3, 4, 40))
    assert torch.count_nonzero(got[:, ~real[:, None, None, :].expand(-1, 4, 40, -1)]) == 0
    assert float(got[:, 0].max()) > 0.5  # the random weights make attention peaked, not uniform


def test_masked_lm_checkpoint_loads_its_encoder_and_a_classifier_is_refused(tmp_path):
    masked = save_tiny_nomic(tmp_path / "mlm", model_class="NomicBertForMaskedLM", seed=1)
    encoder = load_encoder(read_checkpoint(masked))  # keys under "nomic_bert.", cls.* unused
    ids, mask, types = padded_batch_with_types((12, 7), encoder.config.vocab_size, seed=0)
    with torch.no_grad():
        got, _ = encoder(ids, mask, token_type_ids=types)
        want = transformers_model(masked, "eager")(input_ids=ids, attention_mask=mask,
                                                   token_type_ids=types).last_hidden_state
    assert max_error(got, want, mask) <= 1e-4
    classifier = save_tiny_nomic(tmp_path / "cls", model_class="NomicBertForSequenceClassification")
    with pytest.raises(CheckpointError, match="cannot reproduce architecture NomicBertForSequenceClassification"):
        read_checkpoint(classifier)


# One per setting the encoder does not reproduce, in either naming; each is refused from config.json alone.
REFUSED = [
    ({"rotary_emb_fraction": 0.5}, "cannot reproduce rotary_emb_fraction 0.5 (only 1.0)"),
    ({"rotary_emb_interleaved": True}, "cannot reproduce rotary_emb_interleaved True (only False)"),
    ({"rotary_emb_scale_base": 512}, "cannot reproduce rotary_emb_scale_base 512 (only None)"),
    ({"rotary_scaling_factor": 2.0}, "cannot reproduce rotary_scaling_factor 2.0 (only None)"),
    ({"qkv_proj_bias": True}, "cannot reproduce qkv_proj_bias True (only False)"),
    ({"mlp_fc1_bias": True}, "cannot reproduce mlp_fc1_bias True (only False)"),
    ({"mlp_fc2_bias": True}, "cannot reproduce mlp_fc2_bias True (only False)"),
    ({"prenorm": True}, "cannot reproduce prenorm True (only False)"),
    ({"parallel_block": True}, "cannot reproduce parallel_block True (only False)"),
    ({"use_rms_norm": True}, "cannot reproduce use_rms_norm True (only False)"),
    ({"causal": True}, "cannot reproduce causal True (only False)"),
    ({"scale_attn_weights": False}, "cannot reproduce scale_attn_weights False (only True)"),
    ({"activation_function": "gelu"}, "activation_function 'gelu' is not supported (only 'swiglu')"),
    ({"hidden_act": "tanh"}, "hidden_act 'tanh' is not supported"),
    ({"hidden_act": "gelu", "activation_function": "swiglu"},
     "hidden_act 'gelu' and activation_function 'swiglu' disagree"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0}},
     "cannot reproduce rope_parameters"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}},
     "cannot reproduce rope_parameters"),
    ({"rotary_emb_base": 10000}, "rope_parameters.rope_theta 1000.0 and rotary_emb_base 10000 disagree"),
    ({"architectures": ["NomicBertForPreTraining"]}, "cannot reproduce architecture NomicBertForPreTraining"),
]


@pytest.mark.parametrize("change, fragment", REFUSED, ids=[f"{'-'.join(c)}{i}" for i, (c, _) in enumerate(REFUSED)])
def test_settings_the_export_cannot_run_are_refused_before_weights_load(model_dir, tmp_path, change, fragment):
    message = refusal_before_weights_load(model_dir, tmp_path / "refused", change)
    assert fragment in message and "\n" not in message


def test_export_refuses_in_one_line(model_dir, tmp_path):
    checkpoint = tmp_path / "interleaved"
    shutil.copytree(model_dir, checkpoint)
    edit_json(checkpoint / "config.json", rotary_emb_interleaved=True)
    assert_one_line_error(run_cli("export", "--checkpoint", checkpoint, "--out", tmp_path / "out"),
                          "cannot reproduce rotary_emb_interleaved True")
    assert not (tmp_path / "out").exists()


def test_export_verifies_every_variant(exported):
    out, lines = exported
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["pooling"] == "mean" and manifest["prompts"]["query"] == "search_query: "
    for name in ("embeddings", "embeddings_fused", "attention"):
        assert manifest["variants"][name]["parity"]["max_abs_last_hidden_state"] <= 1e-4, name
    assert manifest["variants"]["attention"]["parity"]["max_padded_key_weight"] == 0
    assert manifest["variants"]["embeddings_fp16"]["parity"]["min_cosine_sentence_embedding"] >= 0.999
    assert manifest["variants"]["embeddings_int8"]["parity"]["mean_cosine_sentence_embedding_texts"] >= 0.99


def test_exported_fp32_graphs_match_pytorch_at_unseen_sizes(exported, ours):
    """Batch 5 and 37 tokens with two segments: sizes the graphs were neither traced nor verified at here."""
    import onnxruntime as ort

    ids, mask, types = padded_batch_with_types((37, 20, 3, 37, 11), ours.config.vocab_size, seed=7)
    with torch.no_grad():
        want, want_attentions = ours(ids, mask, output_attentions=True, token_type_ids=types)
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()}
    manifest = json.loads((exported[0] / "manifest.json").read_text())
    fp32 = [name for name, v in manifest["variants"].items() if v["precision"] == "fp32"]
    assert {"embeddings", "embeddings_fused", "attention"} <= set(fp32)
    for name in fp32:
        session = ort.InferenceSession(str(exported[0] / manifest["variants"][name]["file"]),
                                       providers=["CPUExecutionProvider"])
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed), strict=True))
        assert max_error(torch.from_numpy(outputs["last_hidden_state"]), want, mask) <= 1e-4, name
        if "attentions" in outputs:
            assert np.abs(outputs["attentions"] - want_attentions.numpy()).max() <= 1e-5


def test_engine_encodes_as_sentence_transformers_with_prompts(st_dir, exported):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(st_dir), device="cpu")
    engine = Engine.from_directory(exported[0])
    for prompt_name in (None, "query", "document"):
        expected = model.encode(TEXTS, prompt_name=prompt_name)
        encoded = engine.encode(TEXTS, prompt_name=prompt_name)
        assert cosines(encoded.embeddings, expected).min() >= 0.99999, prompt_name
        assert np.abs(encoded.embeddings - expected).max() <= 1e-5, prompt_name
    query, document = engine.encode(TEXTS[:2], prompt_name="query"), engine.encode(TEXTS[:2], prompt_name="document")
    assert np.abs(query.embeddings - document.embeddings).max() > 1e-2  # the prefix really changes the embedding


def test_served_with_a_prompt_as_sentence_transformers(st_dir, exported, tmp_path):
    """A real `attnserve serve` over the artifacts: Embed over gRPC with nomic's query prefix by name."""
    from sentence_transformers import SentenceTransformer

    from attnserve.client.client import make_request, to_result

    from .serving import ServerProcess

    expected = SentenceTransformer(str(st_dir), device="cpu").encode(TEXTS[:3], prompt_name="query")
    server = ServerProcess(exported[0], log_path=tmp_path / "server.log")
    try:
        server.wait_serving()
        with server.channel() as channel:
            request = make_request(TEXTS[:3], truncate=True, prompt_name="query")
            reply = server.stub(channel).Embed(request, timeout=60)
    finally:
        assert server.terminate() == 0, server.log_tail()
    got = np.stack([to_result(e).sentence_embedding for e in reply.embeddings])
    assert cosines(got, expected).min() >= 0.99999
