"""Every model family against code nobody here wrote, transformers' own classes and sentence-transformers: one
table row a family (tests/families_table.py: config, hidden states and maps, head checkpoints, refusals before any
weight loads, the export at unseen sizes, the engine, one server over every row), then the checks no table holds.
One row per architecture kind exports every variant (NomicBERT, ModernBERT, Qwen3 for the Llama-style decoders, Gemma 3,
Gemma 2's soft-capped scores, DeBERTa's disentangled attention; jina-embeddings-v3 a graph set per task; absolute
positions: the default model's, tests/conftest.py); the others their fp32 graphs.
"""

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
from attnserve.engine.manifest import load_manifest
from attnserve.engine.session import CPU, open_session
from attnserve.engine.tasks import task_directory
from attnserve.errors import CheckpointError, InvalidInputError
from attnserve.export.artifacts import add_variants, build_artifacts
from attnserve.export.verify import TOLERANCES
from attnserve.model.attention_reach import EVERY_KEY, beyond, reach_of
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.jina_v3 import TASKS, with_task
from attnserve.model.llm_reranker import KINDS
from attnserve.model.pooling import pool

from .checkpoints import copy_checkpoint, edit_json
from .conftest import assert_one_line_error, run_cli
from .families_table import BY_NAME, FP32, ROWS, TEXTS, Row
from .family_parity import cosines, max_error, padded_batch, refusal_before_weights_load, transformers_model
from .tiny_decoders import LLAMA3_ROPE
from .tiny_gte import alibaba_ntk_inv_freq, save_published
from .tiny_nomic_moe import PROMPTS, reference_model, save_sentence_transformers_files, save_tiny_nomic_moe
from .tiny_static import save_model2vec, save_static_embedding

LENGTHS = [(1,), (5, 3), (16, 9, 1), (48, 17, 33), (100, 64, 7, 100)]
UNSEEN = [(3,), (37, 12, 1), (40, 40, 5, 29, 17)]  # batch and sequence sizes no export traced or verified at
MOE_MAX_SEQ_LENGTH = 48


class Built:
    """Each row's folders, encoder and export, made once for the module, when a test first asks."""

    def __init__(self, root: Path):
        self.root, self.made = root, {}

    def _once(self, key, make):
        if key not in self.made:
            self.made[key] = make()
        return self.made[key]

    def model(self, row: Row) -> Path:
        return self._once(("model", row.name), lambda: row.save(self.root / row.name / "model"))

    def st(self, row: Row) -> Path:
        return self._once(("st", row.name), lambda: row.pipeline(self.model(row), self.root / row.name / "st"))

    def ours(self, row: Row):
        return self._once(("ours", row.name), lambda: load_encoder(read_checkpoint(self.model(row))))

    def sentence_transformer(self, row: Row):
        from sentence_transformers import SentenceTransformer

        return self._once(("stm", row.name), lambda: SentenceTransformer(str(self.st(row)), device="cpu"))

    def published(self) -> Path:
        """The gte row's checkpoint as the Hub publishes GTE v1.5 (tests/tiny_gte.py save_published)."""
        return self._once(("published",), lambda: save_published(self.model(BY_NAME["gte"]), self.root / "new"))

    def moe(self) -> Path:
        """nomic-embed-text-v2-moe's tiny folder, saved by its published code, with sentence-transformers' files."""
        return self._once(("moe",), lambda: save_sentence_transformers_files(
            save_tiny_nomic_moe(self.root / "nomic_moe" / "model"), MOE_MAX_SEQ_LENGTH))

    def moe_exported(self) -> Path:
        def make():
            out = self.root / "nomic_moe" / "artifacts"
            build_artifacts(read_checkpoint(self.moe()), out, log=lambda _: None, variants=FP32)
            return out
        return self._once(("moe_exported",), make)

    def moe_sentence_transformer(self):
        """sentence-transformers over the folder, running the modelling code beside it as a user's trust_remote_code
        runs nomic-embed-text-v2-moe's."""
        from sentence_transformers import SentenceTransformer

        return self._once(("moe_stm",), lambda: SentenceTransformer(str(self.moe()), device="cpu",
                                                                    trust_remote_code=True))

    def exported(self, row: Row) -> tuple[Path, list[str]]:
        def make():
            out, lines = self.root / row.name / "artifacts", []
            build_artifacts(read_checkpoint(self.st(row)), out, log=lines.append, variants=row.variants)
            add_variants(out, row.extra.get("add_variants", []), log=lines.append)
            return out, lines
        return self._once(("exported", row.name), make)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    return Built(tmp_path_factory.mktemp("families"))


def batch(row: Row, cfg, lengths, seed: int, side: str = "right", types: bool | None = None):
    """(ids, mask, token types or None): random ids padded on `side`; types (default: the row's) a second segment
    in each row's second half."""
    lengths = tuple(min(n, row.positions) for n in lengths)
    ids, mask = padded_batch(lengths, cfg.vocab_size, cfg.pad_token_id, seed, side, first_id=row.first_id)
    segment = (torch.arange(max(lengths))[None, :] >= torch.tensor(lengths)[:, None] // 2).long() * mask
    return ids, mask, segment if (row.token_types if types is None else types) else None


def hidden(model, ids, mask, types=None, **kwargs):
    with torch.no_grad():
        extra = {} if types is None else {"token_type_ids": types}
        return model(input_ids=ids, attention_mask=mask, **extra, **kwargs)


def by_row(rows=ROWS, **more):
    return pytest.mark.parametrize("row", rows, ids=[r.name for r in rows], **more)


@by_row()
def test_config_is_read_as_transformers_reads_it(built, row):
    import transformers

    theirs = transformers.AutoConfig.from_pretrained(str(built.model(row)))
    cfg = built.ours(row).config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads) == (
        theirs.vocab_size, theirs.hidden_size, theirs.num_hidden_layers, theirs.num_attention_heads)
    assert cfg.intermediate_size == getattr(theirs, "intermediate_size", getattr(theirs, "hidden_dim", None))
    assert {k: getattr(cfg, k) for k in row.expect} == row.expect


PARITY = [(r, i, s) for r in ROWS for i in r.implementations for s in r.sides]


@pytest.mark.parametrize("row, implementation, side", PARITY, ids=[f"{r.name}-{i}-{s}" for r, i, s in PARITY])
def test_last_hidden_state_matches_transformers(built, row, implementation, side):
    ours, reference = built.ours(row), transformers_model(built.model(row), implementation)
    for seed, lengths in enumerate(LENGTHS):
        ids, mask, types = batch(row, ours.config, lengths, seed, side)
        for token_types in {None, types}:  # with the row's token types, and without
            got, _ = hidden(ours, ids, mask, token_types)
            want = hidden(reference, ids, mask, token_types).last_hidden_state
            assert max_error(got, want, mask) <= 1e-4, (lengths, token_types is None)


SIDES = [(r, s) for r in ROWS for s in r.sides]


@pytest.mark.parametrize("row, side", SIDES, ids=[f"{r.name}-{s}" for r, s in SIDES])
def test_attention_maps_match_transformers_and_give_padding_nothing(built, row, side):
    ours = built.ours(row)
    ids, mask, types = batch(row, ours.config, (40, 17, 1), seed=3, side=side)
    _, got = hidden(ours, ids, mask, types, output_attentions=True)  # (L, B, nh, T, T): per query head
    want = torch.stack(hidden(transformers_model(built.model(row), "eager"), ids, mask, types,
                              output_attentions=True).attentions)
    L, nh = ours.config.num_layers, ours.config.num_heads
    assert got is not None and got.shape == (L, 3, nh, 40, 40)
    real = mask.bool()
    rows = (real[:, None, :, None] & real[:, None, None, :]).expand(L, -1, nh, -1, -1)
    assert float((got - want).abs()[rows].max()) <= 1e-5
    torch.testing.assert_close(got.sum(-1), torch.ones(L, 3, nh, 40), atol=1e-5, rtol=0)
    # From every query, padded ones included: padded keys get exactly 0.
    assert torch.count_nonzero(got[:, ~real[:, None, None, :].expand(-1, nh, 40, -1)]) == 0
    full = got[:, 0]  # (L, nh, T, T), the 40-token row: no padding
    if row.causal:
        # No real query sees a later key. With right padding no padded query does either; a padded query before
        # every real token (left padding) has only padded keys behind it and weighs later real ones.
        later = got.triu(diagonal=1)
        assert torch.count_nonzero(later if side == "right" else later[rows]) == 0
    # The reach the encoder declares (what the manifest tells clients to draw as masked) is exactly where its maps
    # are 0: every key beyond it gets 0, every key within it more.
    reach = reach_of(ours)
    assert all(ahead == 0 for _, ahead in reach) if row.causal else all(
        r == ((row.window[1],) * 2 if row.window and i in row.window[0] else EVERY_KEY) for i, r in enumerate(reach))
    for layer, layer_reach in enumerate(reach):
        closed = beyond(layer_reach, 40)  # (T, T)
        assert torch.count_nonzero(full[layer][:, closed]) == 0, (layer, layer_reach)
        assert bool((full[layer][:, ~closed] > 0).all()), (layer, layer_reach)
    if row.wide_weights:  # the random weights make attention peaked, not uniform, and each head its own
        assert float(full.max()) > 0.5 and float((got[:, :, 0] - got[:, :, 1]).abs().max()) > 0.05


HEADS = [r for r in ROWS if r.masked_lm or r.refused_head]


@by_row(HEADS)
def test_head_checkpoints_load_their_encoder_or_are_refused(tmp_path, row):
    """A masked-LM save prefixes the encoder's keys and adds its head, unused, as transformers' AutoModel (what
    sentence-transformers loads) leaves it; a head whose output the export would drop is refused, by its
    architecture and, that renamed away, by its weights."""
    if row.masked_lm:
        # A bare causal LM of an LLM reranker's architecture is that reranker (model/llm_reranker.py): given the
        # positions its template needs, its encoder loads as any causal LM's.
        room = {"max_position_embeddings": 512} if row.masked_lm in {k.architecture for k in KINDS} else {}
        masked = row.save(tmp_path / "mlm", model_class=row.masked_lm, seed=1, **room)
        encoder = load_encoder(read_checkpoint(masked))
        ids, mask, types = batch(row, encoder.config, (12, 7), seed=0)
        want = hidden(transformers_model(masked, "eager"), ids, mask, types).last_hidden_state
        assert max_error(hidden(encoder, ids, mask, types)[0], want, mask) <= 1e-4
    if row.refused_head:
        head = row.save(tmp_path / "head", model_class=row.refused_head)
        with pytest.raises(CheckpointError, match=f"cannot reproduce architecture {row.refused_head}"):
            read_checkpoint(head)
        if row.head_weights_refused:
            edit_json(head / "config.json", architectures=[row.refused_head.split("For")[0] + "Model"])
            with pytest.raises(CheckpointError, match=r"cannot reproduce the head"):
                read_checkpoint(head)


# (family, a change to config.json, what the one-line refusal says); each is refused from config.json alone.
REFUSED = [
    ("gte", {"rope_parameters": None, "rope_scaling": {"type": "ntk", "factor": 2.0, "mixed_b": 0.5}},
     "cannot reproduce rope settings"),
    ("gte", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "cannot reproduce rope s"),
    ("gte", {"rope_parameters": {"rope_type": "ntk", "rope_theta": 1e4}}, "rope_type 'ntk' needs a factor"),
    ("gte", {"rope_scaling": {"type": "ntk", "factor": 2.0}}, "give rope_parameters or rope_scaling, not both"),
    ("gte", {"rope_parameters": {"rope_type": "ntk", "rope_theta": 1e4, "factor": 0.5}}, "ntk factor must be at le"),
    ("gte", {"layer_norm_type": "rms_norm"}, "cannot reproduce layer_norm_type 'rms_norm' (only 'layer_norm')"),
    ("gte", {"logn_attention_scale": True}, "cannot reproduce logn_attention_scale True (only False)"),
    ("gte", {"logn_attention_clip1": True}, "cannot reproduce logn_attention_clip1 True (only False)"),
    ("gte", {"pack_qkv": False}, "cannot reproduce pack_qkv False (only True)"),
    ("gte", {"position_embedding_type": "absolute"}, "cannot reproduce position_embedding_type 'absolute' (only"),
    ("gte", {"hidden_act": "tanh"}, "hidden_act 'tanh' is not supported"),
    ("gte", {"architectures": ["GteForTokenClassification"]}, "cannot reproduce architecture GteForTokenClassif"),
    *[("nomic_bert", {key: value}, f"cannot reproduce {key} {value} (only {only})") for key, value, only in [
        ("rotary_emb_fraction", 0.5, 1.0), ("rotary_emb_interleaved", True, False),
        ("rotary_emb_scale_base", 512, None), ("rotary_scaling_factor", 2.0, None), ("qkv_proj_bias", True, False),
        ("mlp_fc1_bias", True, False), ("mlp_fc2_bias", True, False), ("prenorm", True, False),
        ("parallel_block", True, False), ("use_rms_norm", True, False), ("causal", True, False),
        ("scale_attn_weights", False, True)]],
    ("nomic_bert", {"activation_function": "gelu"}, "activation_function 'gelu' is not supported (only 'swiglu')"),
    ("nomic_bert", {"hidden_act": "tanh"}, "hidden_act 'tanh' is not supported"),
    ("nomic_bert", {"hidden_act": "gelu", "activation_function": "swiglu"},
     "hidden_act 'gelu' and activation_function 'swiglu' disagree"),
    ("nomic_bert", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0}},
     "cannot reproduce rope_parameters"),
    ("nomic_bert", {"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": .5}},
     "cannot reproduce rope_parameters"),
    ("nomic_bert", {"rotary_emb_base": 10000}, "rope_parameters.rope_theta 1000.0 and rotary_emb_base 10000 disagree"),
    ("nomic_bert", {"architectures": ["NomicBertForPreTraining"]}, "cannot reproduce architecture NomicBertForPreT"),
    ("modernbert", {"hidden_activation": "silu"}, "hidden_activation 'silu' is not supported"),
    ("modernbert", {"rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 1e3, "factor": 2.0}}},
     "cannot reproduce rope_parameters['full_attention']"),
    ("modernbert", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "cannot reproduce rope_scaling"),
    ("modernbert", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "cannot reproduce rope_scaling"),
    ("modernbert", {"layer_types": ["full_attention"]}, "layer_types must list"),
    ("modernbert", {"mlp_bias": "yes"}, "mlp_bias must be true or false"),
    ("eurobert", {"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
    ("eurobert", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "cannot reproduce rope_scaling"),
    ("eurobert", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1000.0, "factor": 8.0}},
     "cannot reproduce rope_parameters"),
    ("eurobert", {"partial_rotary_factor": 0.5}, "cannot reproduce partial_rotary_factor"),
    ("eurobert", {"mlp_bias": "no"}, "mlp_bias must be true or false"),
    ("eurobert", {"num_key_value_heads": 3}, "num_attention_heads must be a multiple of num_key_value_heads"),
    ("eurobert", {"architectures": ["EuroBertForTokenClassification"]}, "cannot reproduce architecture"),
    ("qwen3", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "cannot reproduce rope_scaling"),
    ("qwen3", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0}},
     "cannot reproduce rope_parameters"),
    ("qwen3", {"layer_types": ["full_attention", "sliding_attention", "full_attention"]}, "cannot reproduce layer_t"),
    ("qwen3", {"use_bidirectional_attention": True}, "cannot reproduce bidirectional attention"),
    ("qwen3", {"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
    ("qwen3", {"attention_bias": "yes"}, "attention_bias must be true or false"),
    ("qwen3", {"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
    ("qwen3", {"architectures": ["Qwen3ForSequenceClassification"]}, "cannot reproduce architecture Qwen3ForSeque"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e3, "factor": 2.0}},
     "cannot reproduce rope_parameters"),
    ("llama", {"rope_parameters": None, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     "cannot reproduce rope_scaling"),
    ("llama", {"rope_parameters": {**LLAMA3_ROPE, "high_freq_factor": 0.5}}, "high_freq_factor above low_freq_factor"),
    ("llama", {"attention_bias": "yes"}, "attention_bias must be true or false"),
    ("llama", {"use_bidirectional_attention": True}, "cannot reproduce bidirectional attention"),
    ("llama", {"partial_rotary_factor": 0.5}, "cannot reproduce partial_rotary_factor"),
    ("llama", {"architectures": ["LlamaForSequenceClassification"]}, "cannot reproduce architecture LlamaForSequ"),
    ("mistral", {"sliding_window": 0}, "sliding_window must be a positive integer or null"),
    ("mistral", {"rope_parameters": LLAMA3_ROPE}, "cannot reproduce rope_parameters"),
    ("mistral", {"is_causal": False}, "cannot reproduce bidirectional attention (Mistral attention is causal)"),
    ("qwen2", {"use_sliding_window": True}, "cannot reproduce use_sliding_window true"),
    ("qwen2", {"auto_map": {"AutoModel": "modeling_qwen.Qwen2Model"}}, "cannot reproduce auto_map's AutoModel"),
    ("qwen2", {"layer_types": ["full_attention", "sliding_attention", "full_attention"]}, "cannot reproduce layer_t"),
    ("qwen2", {"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
    ("deberta-v2", {"relative_attention": False}, "cannot reproduce relative_attention false"),
    ("deberta-v2", {"share_att_key": False}, "cannot reproduce share_att_key false"),
    ("deberta-v2", {"conv_kernel_size": 3}, "cannot reproduce conv_kernel_size 3"),
    ("deberta-v2", {"conv_kernel_size": "3"}, "cannot reproduce conv_kernel_size '3'"),
    ("deberta-v2", {"position_buckets": "many"}, "invalid config"),
    ("deberta-v2", {"max_relative_positions": 9}, "cannot reproduce max_relative_positions 9 with position_buckets 16"),
    ("llama", {"rope_parameters": {**LLAMA3_ROPE, "factor": "eight"}}, "invalid config"),
    ("gemma2", {"attn_logit_softcapping": "fifty"}, "attn_logit_softcapping must be a positive number or null"),
    ("mistral", {"sliding_window": True}, "sliding_window must be a positive integer or null"),
    ("qwen2", {"auto_map": ["not", "an", "object"]}, "auto_map"),
    ("deberta-v2", {"pos_att_type": ["c2p", "p2p"]}, "cannot reproduce pos_att_type ['c2p', 'p2p']"),
    ("deberta-v2", {"norm_rel_ebd": "batch_norm"}, "cannot reproduce norm_rel_ebd 'batch_norm'"),
    ("deberta-v2", {"hidden_act": "tanh"}, "hidden_act 'tanh' is not supported"),
    ("deberta-v2", {"position_buckets": 2}, "position_buckets, where given, at least 4"),
    ("gemma2", {"use_bidirectional_attention": True}, "cannot reproduce use_bidirectional_attention true"),
    ("gemma2", {"attn_logit_softcapping": -1.0}, "attn_logit_softcapping must be a positive number or null"),
    ("gemma2", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e3, "factor": 2.0}}, "cannot reproduce r"),
    ("gemma2", {"architectures": ["Gemma2ForSequenceClassification"]}, "cannot reproduce architecture Gemma2ForSeq"),
    ("gemma", {"use_bidirectional_attention": True}, "cannot reproduce use_bidirectional_attention true"),
    ("gemma", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e3, "factor": 2.0}}, "cannot reproduce ro"),
    ("gemma", {"hidden_act": "quick_gelu"}, "hidden_act"),
    ("gemma", {"attention_bias": "yes"}, "attention_bias"),
    ("gemma3_text", {"architectures": ["Gemma3ForCausalLM"]}, "cannot reproduce architecture Gemma3ForCausalLM"),
    ("gemma3_text", {"hidden_activation": "relu"}, "hidden_activation 'relu' is not supported"),
    ("gemma3_text", {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "cannot reproduce rope_scaling"),
    ("gemma3_text", {"rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 1e3, "factor": 8.}}},
     "cannot reproduce rope_parameters['full_attention']"),
    ("gemma3_text", {"layer_types": ["full_attention"]}, "layer_types must list"),
    ("gemma3_text", {"use_bidirectional_attention": "yes"}, "use_bidirectional_attention must be true or false"),
    ("gemma3_text", {"num_key_value_heads": 3}, "num_attention_heads must be a multiple of num_key_value_heads"),
    ("gemma3_text", {"head_dim": 0}, "invalid config: sizes must be positive"),
    ("jina_embeddings_v3", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e3, "factor": 2.0}},
     "cannot reproduce rope_param"),
    ("jina_embeddings_v3", {"lora_adaptations": ["retrieval.query"]},
     "adapter 'classification' is not in config.json's lora_adaptations"),
    ("jina_embeddings_v3", {"lora_adaptations": [*TASKS, "summarize"]}, "lora_adaptations names 'summarize'"),
    ("jina_embeddings_v3", {"hidden_act": "swish"}, "hidden_act 'swish' is not supported"),
    ("jina_embeddings_v3", {"architectures": ["JinaEmbeddingsV3ForSequenceClassification"]}, "cannot reproduce arch"),
    *[("jina_embeddings_v3", {"adapters/separation/adapter_config.json": {key: value}}, f"cannot reproduce {key}")
      for key, value in [("use_dora", True), ("use_rslora", True), ("target_modules", ["dense"]),
                         ("modules_to_save", ["pooler"])]],
]


# GTE v1.5 as published (model_type "new"): what is not it.
REFUSED += [("new", change, fragment) for change, fragment in [
    ({"auto_map": {"AutoModel": "someone/other-impl--modeling.NewModel"}}, "model_type 'new' is read only as GTE"),
    ({"auto_map": None}, "model_type 'new' is read only as GTE v1.5, whose auto_map names Alibaba-NLP/new-impl"),
    ({"architectures": ["NewForSequenceClassification"]}, "cannot reproduce architecture NewForSequenceClassification"),
    ({"architectures": ["NewForTokenClassification"], "id2label": {"0": "O", "1": "B-PER"}},
     "cannot reproduce NewForTokenClassification with 2 labels"),
    ({"rope_theta": None}, "a published GTE config must give rope_theta"),
    ({"logn_attention_scale": True}, "cannot reproduce logn_attention_scale True (only False)"),
    ({"rope_scaling": {"type": "ntk", "factor": 2.0, "mixed_b": 0.5}}, "cannot reproduce rope settings")]]


@pytest.mark.parametrize("name, change, fragment", REFUSED, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(REFUSED)])
def test_settings_the_export_cannot_run_are_refused_before_weights_load(built, tmp_path, name, change, fragment):
    source = built.published() if name == "new" else built.model(BY_NAME[name])
    message = refusal_before_weights_load(source, tmp_path / "refused", change)
    assert fragment in message and "\n" not in message


@pytest.mark.parametrize("name, change, fragment", [
    ("qwen3", {"use_sliding_window": True, "sliding_window": 8}, "cannot reproduce use_sliding_window true"),
    ("jina_embeddings_v3", {"adapters/separation/adapter_config.json": {"use_dora": True}}, "cannot reproduce use_d")])
def test_export_refuses_in_one_line_before_reading_weights(built, tmp_path, name, change, fragment):
    """The refusals above, as `attnserve export` says them: one line, nothing written (the weights are not weights:
    reading them would fail otherwise)."""
    assert fragment in refusal_before_weights_load(built.model(BY_NAME[name]), tmp_path / "checkpoint", change)
    assert_one_line_error(run_cli("export", "--checkpoint", tmp_path / "checkpoint", "--out", tmp_path / "out"),
                          fragment)
    assert not (tmp_path / "out").exists()


@by_row()
def test_export_verifies_its_variants(built, row):
    out, lines = built.exported(row)
    manifest, model = load_manifest(out), built.sentence_transformer(row)
    assert manifest.family == row.name and manifest.max_seq_length == row.max_seq_length
    assert {n: manifest.prompts[n] for n in row.prompts} == {n: model.prompts[n] for n in row.prompts}
    assert (manifest.pooling, manifest.normalize, manifest.embedding_size) == (
        model[1].pooling_mode, type(model[-1]).__name__ == "Normalize", model.get_embedding_dimension())
    graph_inputs = [i.name for i in open_session(out / "embeddings.onnx", CPU).get_inputs()]
    assert graph_inputs == ["input_ids", "attention_mask"] + ["token_type_ids"] * row.token_types
    for name, variant in manifest.variants.items():
        if variant.precision == "fp32":
            assert variant.parity["max_abs_last_hidden_state"] <= 1e-4, name
    if row.fused is not None:
        assert manifest.variants["embeddings_fused"].fused == row.fused
    if row.fused is False and row.variants is None:  # said as what it is, not as "0 Attention nodes"
        assert any("fuses no attention of this family" in line for line in lines), lines
        assert not any("0 Attention nodes" in line for line in lines), lines
        assert not any(v.fused for v in manifest.variants.values())
    if row.variants is None or "attention" in row.variants:
        attention, last = manifest.variants["attention"].parity, manifest.variants["attention_last"].parity
        # Each head's value norms (model/value_norms.py), and the last layer's maps and rollout in a graph of their
        # own (export/attention_last.py): verified against the PyTorch encoder. A local layer's out-of-window keys
        # weigh 0 as padded ones do: rollout's real block is exact all the same.
        assert attention["max_rel_value_norms"] <= 1e-4 and attention["max_padded_key_weight"] == 0
        assert last["max_abs_rollout"] <= 1e-4 and last["max_abs_attentions"] <= 1e-4
        assert last["max_padded_key_weight"] == 0
        assert manifest.variants["embeddings_fp16"].parity["min_cosine_sentence_embedding"] >= 0.999
        assert manifest.variants["embeddings_int8"].parity["mean_cosine_sentence_embedding_texts"] >= 0.99
    else:
        assert set(manifest.variants) == set(row.variants)


@pytest.mark.parametrize("row, side", SIDES, ids=[f"{r.name}-{s}" for r, s in SIDES])
def test_every_fp32_graph_matches_pytorch_at_unseen_sizes(built, row, side):
    out, ours = built.exported(row)[0], built.ours(row)
    manifest = load_manifest(out)
    for name in (n for n, v in manifest.variants.items() if v.precision == "fp32"):
        session = open_session(out / manifest.variants[name].file, CPU)
        for seed, lengths in enumerate(UNSEEN):
            ids, mask, types = batch(row, ours.config, lengths, seed, side)
            feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
            outputs = dict(zip([o.name for o in session.get_outputs()],
                               session.run(None, feed | ({} if types is None else {"token_type_ids": types.numpy()})),
                               strict=True))
            want, attentions = hidden(ours, ids, mask, types, output_attentions=True)
            assert max_error(torch.from_numpy(outputs["last_hidden_state"]), want, mask) <= 1e-4, (name, lengths)
            if row.name == "qwen3":  # the graph's sentence embedding: lasttoken pooling, not normalised
                assert np.abs(outputs["sentence_embedding"] - pool(want, mask, "lasttoken").numpy()).max() <= 1e-4
            if "attentions" in outputs:
                # Real queries' rows: a left-padded padded query's row is not an output anyone reads.
                real = mask.bool().numpy()
                rows = np.broadcast_to(real[None, :, None, :, None] & real[None, :, None, None, :], attentions.shape)
                assert np.abs(outputs["attentions"] - attentions.numpy())[rows].max() <= 1e-5, (name, lengths)


@by_row()
def test_engine_encodes_as_sentence_transformers(built, row):
    model, out = built.sentence_transformer(row), built.exported(row)[0]
    engine = Engine.from_directory(out)
    for prompt_name in (*row.prompts, None):  # None last: `encoded` below is the texts' own
        expected = model.encode(TEXTS, prompt_name=prompt_name)
        encoded = engine.encode(TEXTS, prompt_name=prompt_name)
        assert cosines(encoded.embeddings, expected).min() >= 0.99999, prompt_name
        assert np.abs(encoded.embeddings - expected).max() <= 1e-5, prompt_name
    lengths = [len(model.tokenizer(text)["input_ids"]) for text in TEXTS]
    assert encoded.truncated.tolist() == [n > row.max_seq_length for n in lengths] and encoded.truncated[4]
    if row.prompts:  # the prompt reaches the model: it changes every embedding
        assert cosines(engine.encode(TEXTS[:3], prompt_name=row.prompts[0]).embeddings,
                       engine.encode(TEXTS[:3]).embeddings).max() < 0.99
    if "embeddings_int8" in load_manifest(out).variants:
        # The bar export verified the int8 graph by (a mean over texts), here on other texts, through the engine.
        int8 = cosines(Engine.from_directory(out, EngineConfig(precision="int8")).encode(TEXTS).embeddings,
                       model.encode(TEXTS))
        assert int8.mean() >= TOLERANCES["int8"].limit and int8.min() >= 0.95, int8


ATTENDED = [r for r in ROWS if r.variants is None or "attention" in r.variants]


@by_row(ATTENDED)
def test_engine_attention_maps_over_padding(built, row):
    engine = Engine.from_directory(built.exported(row)[0], attention=True)
    inputs = engine.tokenizer.encode_texts(["x", TEXTS[4]])
    short, T = len(inputs[0]), len(inputs[1])
    out = engine.run(inputs, attention=True)
    cfg = built.ours(row).config
    assert out.attentions is not None and out.attentions.shape == (cfg.num_layers, 2, cfg.num_heads, T, T)
    np.testing.assert_allclose(out.attentions.sum(-1), 1.0, atol=1e-5)
    assert np.count_nonzero(out.attentions[:, 0, :, :, short:]) == 0  # the engine pads on the right
    if row.window:
        layers, half = row.window
        distance = np.abs(np.arange(T)[None, :] - np.arange(T)[:, None])
        assert np.count_nonzero(out.attentions[list(layers), 1][..., distance > half]) == 0


def test_one_server_serves_every_family_as_sentence_transformers(built, artifacts, tmp_path):
    """A real `attnserve serve` over every row's export (jina-embeddings-v3 the default) and the default model:
    Embed over gRPC with each family's first prompt by name; attention maps where the graphs are built, labelled
    with the tokenizer's tokens; `task` on every door (gRPC's EmbedRequest.task, the openai client's extra_body,
    TEI's /embed), an unknown one a bad request on each, and any on a model without adapters."""
    import grpc
    import httpx
    import openai

    from attnserve.client.client import make_request, to_result
    from attnserve.v1.encoder_pb2 import GetModelInfoRequest

    from .serving import ServerProcess, serving

    jina = built.exported(BY_NAME["jina_embeddings_v3"])[0]
    tasks = {task: Engine.from_directory(task_directory(load_manifest(jina), task)).encode(TEXTS[:3]).embeddings
             for task in (None, "retrieval.query", "separation")}
    assert cosines(tasks["retrieval.query"], tasks[None]).max() < 0.999  # the tasks really differ
    flags = [f for row in reversed(ROWS) for f in ("--model", f"{row.name}={built.exported(row)[0]}")]
    flags += ["--model", f"nomic_moe={built.moe_exported()}"]  # nomic-embed-text-v2-moe, its published code's
    references = [(row.name, row.prompts[0] if row.prompts else None, built.sentence_transformer(row)) for row in ROWS]
    references.append(("nomic_moe", "query", built.moe_sentence_transformer()))
    with serving(ServerProcess(None, *flags, "--model", f"minilm={artifacts}", log_path=tmp_path / "log")) as server:
        with server.channel() as channel:
            stub = server.stub(channel)
            for name, prompt, model in references:
                request = make_request(TEXTS[:3], truncate=True, prompt_name=prompt, model=name)
                got = np.stack([to_result(e).sentence_embedding for e in stub.Embed(request, timeout=60).embeddings])
                assert cosines(got, model.encode(TEXTS[:3], prompt_name=prompt)).min() >= 0.99999, name
            for row in ATTENDED:
                engine = Engine.from_directory(built.exported(row)[0], attention=True)
                request = make_request(TEXTS[-2:], attention_layers=[0, 1, -1], truncate=True, model=row.name)
                results = [to_result(e) for e in stub.Embed(request, timeout=60).embeddings]
                for text, result in zip(TEXTS[-2:], results, strict=True):
                    inputs = engine.tokenizer.encode_texts([text])
                    reference = engine.run(inputs, attention=True).attentions[:, 0]  # (L, nh, T, T)
                    assert result.attentions.shape == (3, *reference.shape[1:]) and len(result.tokens) == len(inputs[0])
                    np.testing.assert_allclose(result.attentions, reference[[0, 1, -1]], atol=1e-5)
                assert row.name != "modernbert" or results[0].tokens[::len(results[0].tokens) - 1] == ["[CLS]", "[SEP]"]
            assert tuple(stub.GetModelInfo(GetModelInfoRequest()).tasks) == TASKS
            for task in (None, "retrieval.query", "separation"):
                request = make_request(TEXTS[:3], normalize=True)
                if task is not None:  # unset on the wire: the model without a task
                    request.task = task
                got = np.stack([to_result(e).sentence_embedding for e in stub.Embed(request, timeout=60).embeddings])
                np.testing.assert_allclose(got, tasks[task], atol=2e-6)
            for model, task, says in (("", "retrieval", "'retrieval' is not one of"),
                                      ("minilm", "retrieval.query", "has no task adapters")):
                request = make_request(TEXTS[:1], model=model)
                request.task = task
                with pytest.raises(grpc.RpcError) as refused:
                    stub.Embed(request, timeout=60)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in refused.value.details()
        client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused")
        reply = client.embeddings.create(model="", input=TEXTS[:3], extra_body={"task": "separation"})
        np.testing.assert_allclose([d.embedding for d in reply.data], tasks["separation"], atol=2e-6)
        with pytest.raises(openai.BadRequestError, match="not one of"):
            client.embeddings.create(model="", input=TEXTS[:1], extra_body={"task": "nope"})
        tei = httpx.post(f"{server.http_url}/embed", json={"inputs": TEXTS[:3], "task": "retrieval.query"})
        assert tei.status_code == 200, tei.text
        np.testing.assert_allclose(tei.json(), tasks["retrieval.query"], atol=2e-6)
        assert httpx.post(f"{server.http_url}/embed", json={"inputs": "x", "task": "nope"}).status_code == 400
        reply = httpx.post(f"{server.http_url}/v1/embeddings", json={"input": "x", "model": "minilm",
                                                                     "task": "retrieval.query"})
        assert reply.status_code == 400 and "has no task adapters" in json.dumps(reply.json())


# The checks no table row holds, by family.

def test_bert_a_pair_through_the_graph_matches_transformers_with_the_same_token_types(built):
    from tokenizers import Tokenizer

    from attnserve.engine.batching import pad

    row = BY_NAME["bert"]
    out, ckpt = built.exported(row)[0], read_checkpoint(built.st(row))
    pairs = Tokenizer.from_file(str(ckpt.tokenizer_file)).encode_batch([
        ("hello world", "a longer second segment, with punctuation!"), ("x", "y"),
        ("the quick brown fox", "jumps over the lazy dog")])
    ids, mask = pad([np.asarray(e.ids) for e in pairs])
    types, _ = pad([np.asarray(e.type_ids) for e in pairs])
    assert types.any()
    session = open_session(out / "embeddings_fused.onnx", CPU)
    got, sentence = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    theirs = hidden(transformers_model(built.model(row), "eager"), *map(torch.from_numpy, (ids, mask, types)))
    theirs = theirs.last_hidden_state
    assert np.abs(sentence - pool(theirs, torch.from_numpy(mask), "mean").numpy()).max() <= 1e-4
    assert np.abs(got - theirs.numpy())[mask.astype(bool)].max() <= 1e-4
    # The same rows without types are another input: the types really reach the graph.
    without = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[1]
    assert np.abs(without - sentence).max() > 1e-3


def test_bert_legacy_gamma_beta_layer_norm_names_load(built, tmp_path):
    from safetensors.torch import load_file, save_file

    model = shutil.copytree(built.model(BY_NAME["bert"]), tmp_path / "model")
    expected = built.ours(BY_NAME["bert"]).state_dict()
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in load_file(model / "model.safetensors").items()}
    assert sum(k.endswith("gamma") for k in renamed) == 5  # embeddings and two per layer
    save_file(renamed, model / "model.safetensors", metadata={"format": "pt"})
    loaded = load_encoder(read_checkpoint(model)).state_dict()
    assert all((loaded[k] == v).all() for k, v in expected.items())


@pytest.mark.parametrize("name, types", [("gte", 1), ("gte", 2), ("nomic_bert", 2)])
def test_token_types_as_transformers_adds_them_and_they_matter(built, tmp_path, name, types):
    """GTE with one type (gte-multilingual-base): its row is added to every token, the graphs take no types; two:
    they matter. NomicBERT: its segments, and its rotary positions (reversed tokens are not reversed outputs)."""
    row = BY_NAME[name]
    model = built.model(row) if name == "nomic_bert" else row.save(tmp_path / "typed", seed=1, type_vocab_size=types)
    encoder = load_encoder(read_checkpoint(model))
    assert encoder.config.has_token_types == (types == 2)
    ids, mask, segments = batch(row, encoder.config, (30, 11), seed=0, types=True)
    segments = segments if types == 2 else None
    got, _ = hidden(encoder, ids, mask, segments)
    assert max_error(got, hidden(transformers_model(model, "eager"), ids, mask, segments).last_hidden_state,
                     mask) <= 1e-4
    if types == 2:
        assert max_error(got, hidden(encoder, ids, mask)[0], mask) > 0.05
    if name == "nomic_bert":
        plain, reversed_ids = hidden(encoder, ids[:1], mask[:1])[0], hidden(encoder, ids[:1].flip(1), mask[:1])[0]
        assert float((plain.flip(1) - reversed_ids).abs().max()) > 0.05


@pytest.mark.parametrize("form", ["rope_scaling", "rope_parameters", "published"])
def test_gte_ntk_scaled_rotary_matches_transformers_given_alibabas_frequencies(built, tmp_path, form):
    """The published form (rope_theta with rope_scaling {"type": "ntk"}; published: gte-base-en-v1.5's model_type
    "new" folder) and transformers 5's (rope_parameters with rope_type "ntk"). transformers has no "ntk" rope type,
    so its GteModel gets Alibaba's frequencies by hand."""
    row = BY_NAME["gte"]
    model_dir = built.model(row)
    scaled = shutil.copytree(built.published() if form == "published" else model_dir, tmp_path / "s")
    unscaled = shutil.copytree(model_dir, tmp_path / "u")
    if form == "rope_parameters":
        edit_json(scaled / "config.json", rope_parameters={"rope_type": "ntk", "rope_theta": 500_000.0, "factor": 2.0})
    else:
        edit_json(scaled / "config.json", rope_parameters=None, rope_theta=500_000 if form == "published" else
                  500_000.0, rope_scaling={"type": "ntk", "factor": 2.0})
    edit_json(unscaled / "config.json", rope_parameters={"rope_type": "default", "rope_theta": 500_000.0})
    encoder = load_encoder(read_checkpoint(scaled))
    assert (encoder.config.rope_theta, encoder.config.ntk_factor) == (500_000.0, 2.0)
    assert encoder.config.family == ("new" if form == "published" else "gte")
    reference = transformers_model(model_dir, "eager")
    reference.rotary_emb.inv_freq.copy_(alibaba_ntk_inv_freq(16, 500_000.0, 2.0))
    ids, mask, _ = batch(row, encoder.config, (100, 64, 7), seed=5)
    got = hidden(encoder, ids, mask)[0]
    assert max_error(got, hidden(reference, ids, mask).last_hidden_state, mask) <= 1e-4
    without_scaling = hidden(load_encoder(read_checkpoint(unscaled)), ids, mask)[0]
    assert max_error(got, without_scaling, mask) > 0.05  # the scaling matters


def test_nomic_published_config_naming_reads_the_same(built, tmp_path):
    """nomic-embed-text-v1.5's config.json uses the remote code's names (n_embd, rotary_emb_base, ...)."""
    from .tiny_nomic import as_published

    published = shutil.copytree(built.model(BY_NAME["nomic_bert"]), tmp_path / "published")
    as_published(published / "config.json")
    assert "n_embd" in json.loads((published / "config.json").read_text())
    assert read_checkpoint(published).config == built.ours(BY_NAME["nomic_bert"]).config
    edit_json(published / "config.json", rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, hidden_size=64)
    assert read_checkpoint(published).config == built.ours(BY_NAME["nomic_bert"]).config  # both namings, agreeing
    edit_json(published / "config.json", hidden_size=32)
    with pytest.raises(CheckpointError, match="hidden_size 32 and n_embd 64 disagree"):
        read_checkpoint(published)


def test_gte_published_keys_are_what_transformers_saves(built):
    """transformers writes the remote code's names back when it saves: the renaming in tests/tiny_gte.py is
    conversion_mapping's, reversed, or both would disagree."""
    from safetensors import safe_open

    with safe_open(str(built.model(BY_NAME["gte"]) / "model.safetensors"), "pt") as a, \
            safe_open(str(built.published() / "model.safetensors"), "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())


@pytest.mark.parametrize("architecture", ["NewModel", "NewForMaskedLM", "NewForTokenClassification"])
def test_gte_published_checkpoint_matches_transformers_on_the_original(built, tmp_path, architecture):
    folder = save_published(built.model(BY_NAME["gte"]), tmp_path / "published", architecture)
    ckpt = read_checkpoint(folder)
    assert ckpt.config.family == "new"
    encoder, reference = load_encoder(ckpt), transformers_model(built.model(BY_NAME["gte"]), "eager")
    for seed, lengths in enumerate(LENGTHS[::2]):
        ids, mask, _ = batch(BY_NAME["gte"], encoder.config, lengths, seed)
        assert max_error(hidden(encoder, ids, mask)[0], hidden(reference, ids, mask).last_hidden_state, mask) <= 1e-4


def test_gte_engine_over_the_published_folder_encodes_as_sentence_transformers_over_the_original(built, tmp_path,
                                                                                                  monkeypatch):
    """Exported without transformers asking whether to run the auto_map's remote code (its tokenizer check). The
    fp32 graph, which the comparison reads: the rotary encoder's other variants are the nomic_bert row's."""
    row = BY_NAME["gte"]
    folder = save_published(built.st(row), tmp_path / "published")
    monkeypatch.setattr("builtins.input", lambda *args: pytest.fail(f"transformers asked: {args}"))
    build_artifacts(read_checkpoint(folder), tmp_path / "out", log=lambda line: None, variants=["embeddings"])
    encoded = Engine.from_directory(tmp_path / "out").encode(TEXTS)
    assert cosines(encoded.embeddings, built.sentence_transformer(row).encode(TEXTS)).min() >= 0.99999
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["family"] == "new"


@pytest.mark.parametrize("name, unwindowed", [("modernbert", {"local_attention": 10_000}),
                                              ("gemma3_text", {"sliding_window": 10_000}),
                                              ("mistral", {"sliding_window": None}), ("llama", {"llama3_rope": None}),
                                              ("gemma2", {"sliding_window": 10_000}),
                                              ("gemma2", {"attn_logit_softcapping": None})])
def test_the_window_matters(built, name, unwindowed):
    """The parity above would hold for a model that ignored the window (or Llama 3's scaled rotary positions, or
    Gemma 2's soft-capping); this one's outputs change without it."""
    ours = built.ours(BY_NAME[name])
    everywhere = type(ours)(dataclasses.replace(ours.config, **unwindowed))
    everywhere.load_state_dict(ours.state_dict())
    ids, mask, _ = batch(BY_NAME[name], ours.config, (40, 17), seed=0)
    assert max_error(hidden(ours, ids, mask)[0], hidden(everywhere, ids, mask)[0], mask) > 0.05


def _legacy(config: dict, drop: tuple[str, ...], **add) -> dict:
    return {k: v for k, v in config.items() if k not in drop} | add


@pytest.mark.parametrize("name", ["modernbert", "eurobert", "qwen3", "gemma3_text", "llama", "mistral", "gemma"])
def test_the_transformers_4_config_form_reads_as_transformers_reads_it(built, name):
    """The 4.x form of the same settings (no layer_types or rope_parameters: rope_theta and its kin beside the
    other keys) reads the same, here and in transformers."""
    import transformers

    from attnserve.model.families import FAMILIES

    config_file = built.model(BY_NAME[name]) / "config.json"
    raw, cfg = json.loads(config_file.read_text()), built.ours(BY_NAME[name]).config
    read = lambda legacy: FAMILIES[name].read_config(legacy, config_file)  # noqa: E731
    if name == "modernbert":
        legacy = _legacy(raw, ("layer_types", "rope_parameters"), global_rope_theta=1000.0, local_rope_theta=100.0)
        theirs = transformers.ModernBertConfig.from_dict(legacy)
        assert read(legacy) == cfg and tuple(theirs.layer_types) == cfg.layer_types
        assert theirs.sliding_window == cfg.half_window
        assert [theirs.rope_parameters[t]["rope_theta"] for t in cfg.layer_types[:2]] == [1000.0, 100.0]
    elif name == "eurobert":  # no head_dim or key/value heads: the defaults
        legacy = _legacy(raw, ("rope_parameters", "head_dim", "num_key_value_heads", "pad_token_id"),
                         rope_theta=500.0, clf_pooling="bos")
        theirs, mine = transformers.EuroBertConfig.from_dict(legacy), read(legacy)
        assert (mine.head_size, mine.num_kv_heads, mine.pad_token_id) == (
            theirs.head_dim, theirs.num_key_value_heads, theirs.pad_token_id) == (16, 4, 128001)
        assert mine.rope_theta == theirs.rope_parameters["rope_theta"] == 500.0
    elif name == "qwen3":  # as Qwen3-Embedding's config.json has it
        legacy = _legacy(raw, ("layer_types", "rope_parameters"), rope_theta=1000.0, rope_scaling=None,
                         sliding_window=None, use_sliding_window=False)
        assert read(legacy) == cfg
        assert transformers.Qwen3Config.from_dict(legacy).rope_parameters["rope_theta"] == 1000.0
    elif name == "llama":  # as Llama 3.1's config.json has it: rope_scaling beside rope_theta
        scaling = {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}
        legacy = _legacy(raw, ("rope_parameters",), rope_theta=1000.0, rope_scaling=scaling)
        theirs = transformers.LlamaConfig.from_dict(legacy)
        assert read(legacy) == cfg and theirs.rope_parameters["rope_type"] == "llama3"
        assert theirs.rope_parameters["rope_theta"] == cfg.rope_theta == 1000.0
    elif name == "mistral":  # no sliding_window key: MistralConfig's 4096
        legacy = _legacy(raw, ("rope_parameters", "sliding_window", "head_dim"), rope_theta=1000.0)
        theirs, mine = transformers.MistralConfig.from_dict(legacy), read(legacy)
        assert (mine.sliding_window, mine.head_size) == (theirs.sliding_window, theirs.head_dim) == (4096, 16)
        assert mine.rope_theta == theirs.rope_parameters["rope_theta"] == 1000.0
    elif name == "gemma":  # as bge-reranker-v2-gemma's config.json has it: rope_theta, the legacy hidden_act "gelu"
        legacy = _legacy(raw, ("rope_parameters",), rope_theta=1000.0, rope_scaling=None, hidden_act="gelu")
        theirs = transformers.GemmaConfig.from_dict(legacy)
        assert read(legacy) == cfg and theirs.hidden_act == cfg.activation == "gelu_pytorch_tanh"
        assert theirs.rope_parameters["rope_theta"] == 1000.0
    else:  # layer types from sliding_window_pattern; transformers' bidirectional window is sliding_window // 2 + 1
        legacy = _legacy(raw, ("layer_types", "rope_parameters"), rope_theta=1000.0, rope_local_base_freq=100.0,
                         sliding_window_pattern=2)
        theirs, mine = transformers.Gemma3TextConfig.from_dict(legacy), read(legacy)
        assert mine == dataclasses.replace(cfg, layer_types=cfg.layer_types[:2] * 2)
        assert tuple(theirs.layer_types) == mine.layer_types and theirs.sliding_window == 4 + 1
        assert [theirs.rope_parameters[t]["rope_theta"] for t in mine.layer_types[1::-1]] == [1000.0, 100.0]


@pytest.mark.parametrize("name, biases", [("modernbert", 2 + 4 * 6 - 1), ("eurobert", 4 * 7), ("llama", 3 * 7)])
def test_biases_where_the_config_asks_for_them(tmp_path, name, biases):
    row = BY_NAME[name]
    flags = {"attention_bias": True, "mlp_bias": True} | ({"norm_bias": True} if name == "modernbert" else {})
    model = row.save(tmp_path / "biased", seed=2, **flags)
    encoder = load_encoder(read_checkpoint(model))
    assert sum(n.endswith(".bias") for n, _ in encoder.named_parameters()) == biases  # modernbert's layer 0: no norm
    ids, mask, _ = batch(row, encoder.config, (30, 11), seed=0)
    assert max_error(hidden(encoder, ids, mask)[0], hidden(transformers_model(model, "eager"), ids, mask)
                     .last_hidden_state, mask) <= 1e-4


def test_nomic_moe_runs_as_its_published_code_every_expert_routed_to(built):
    """nomic-embed-text-v2-moe against its published modelling code (tests/reference/nomic_moe, its own
    from_pretrained over the folder): mixtures in layers 1 and 3 as the code places them, every weight the code
    loaded the one ours did, and the hidden states on real positions, over batches whose tokens reach every
    expert."""
    from safetensors.torch import load_file

    from attnserve.model.nomic_moe import MixtureOfExperts

    reference, ours = reference_model(built.moe()), load_encoder(read_checkpoint(built.moe()))
    assert [type(layer.mlp).__name__ for layer in reference.encoder.layers] == [
        "NomicBertMLP", "NomicMoELayer", "NomicBertMLP", "NomicMoELayer"]
    assert [isinstance(layer.feed_forward, MixtureOfExperts) for layer in ours.layers] == [False, True, False, True]
    saved = load_file(built.moe() / "model.safetensors")  # the code loads with strict=False: every weight arrived
    assert saved.keys() == reference.state_dict().keys()
    assert all(torch.equal(saved[k], v) for k, v in reference.state_dict().items())
    chosen: list[torch.Tensor] = []  # each mixture's top-2 experts of every token of each batch
    hooks = [layer.feed_forward.router.register_forward_hook(lambda _, __, logits: chosen.append(logits.topk(2)[1]))
             for layer in ours.layers if isinstance(layer.feed_forward, MixtureOfExperts)]
    for seed, lengths in enumerate(LENGTHS):
        ids, mask = padded_batch(lengths, 2000, 1, seed, first_id=6)  # the tokenizer's ids, <pad> 1
        got, _ = hidden(ours, ids, mask)
        want = hidden(reference, ids, mask).last_hidden_state
        assert max_error(got, want, mask) <= 1e-5, lengths
        assert torch.nn.functional.cosine_similarity(got[mask.bool()], want[mask.bool()], dim=-1).min() >= 0.99999
    for hook in hooks:
        hook.remove()
    assert all(len(experts.unique()) == 8 for experts in chosen[-2:])  # the largest batch reaches all 8, both layers


def test_nomic_moe_graph_routes_as_the_published_code_at_unseen_sizes(built):
    """The fp32 graphs (the router's TopK, each expert's tokens found by NonZero and added back by ScatterND)
    against the published code, at sizes no export traced or verified at; a one-token batch leaves six experts
    with no token at all."""
    import onnx

    out = built.moe_exported()
    manifest, reference = load_manifest(out), reference_model(built.moe())
    assert manifest.family == "nomic_bert" and set(manifest.variants) == set(FP32)
    assert all(manifest.prompts[name] == prompt for name, prompt in PROMPTS.items())
    ops = [n.op_type for n in onnx.load(out / "embeddings.onnx", load_external_data=False).graph.node]
    assert (ops.count("TopK"), ops.count("NonZero"), ops.count("ScatterND")) == (2, 16, 16)  # 2 mixtures of 8
    for name in FP32:
        session = open_session(out / manifest.variants[name].file, CPU)
        assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]  # one token type
        for seed, lengths in enumerate([(1,), *UNSEEN]):
            ids, mask = padded_batch(lengths, 2000, 1, seed, first_id=6)
            got = session.run(["last_hidden_state"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
            want = hidden(reference, ids, mask).last_hidden_state
            assert max_error(torch.from_numpy(got), want, mask) <= 1e-4, (name, lengths)


def test_nomic_moe_engine_encodes_as_sentence_transformers_over_its_published_code(built):
    """The served embeddings, with each of its prompts (search_query: / search_document:) and none, against
    sentence-transformers running the published code as its users do (trust_remote_code)."""
    model, engine = built.moe_sentence_transformer(), Engine.from_directory(built.moe_exported())
    assert type(model[0].auto_model).__module__.endswith("modeling_hf_nomic_bert")  # the published code, not ours
    for prompt_name in (*PROMPTS, None):
        expected = model.encode(TEXTS, prompt_name=prompt_name)
        encoded = engine.encode(TEXTS, prompt_name=prompt_name)
        assert cosines(encoded.embeddings, expected).min() >= 0.99999, prompt_name
        assert np.abs(encoded.embeddings - expected).max() <= 1e-5, prompt_name
    assert encoded.truncated[4]  # the long text cut at max_seq_length, as sentence-transformers cuts it
    plain = engine.encode(TEXTS[:3]).embeddings  # each prompt reaches the model (0.99999 above tells them apart)
    assert all(cosines(engine.encode(TEXTS[:3], prompt_name=name).embeddings, plain).min() < 0.995 for name in PROMPTS)


# (a change to nomic-embed-text-v2-moe's config.json, what the one-line refusal says): settings its published code
# would not run as this code does, or that its weights would not match.
MOE_REFUSED = [
    ({"moe_normalize_expert_weights": 2.0}, "cannot reproduce moe_normalize_expert_weights 2.0 (only False)"),
    ({"num_shared_experts": 1}, "cannot reproduce num_shared_experts 1 (only 0)"),
    ({"expert_choice_router": True}, "cannot reproduce expert_choice_router True (only False)"),
    ({"activation_function": "swiglu"}, "activation_function 'swiglu' is not supported (only gelu, gelu_new"),
    ({"moe_top_k": 9}, "moe_top_k from 1 to num_experts, got 8 and 9"),
    ({"num_experts": 0}, "num_experts must be at least 1"),
    ({"n_inner": None}, "missing field 'n_inner'"),
    ({"moe_every_n_layers": "2"}, "moe_every_n_layers must be a whole number, got '2'"),
    ({"moe_top_k": "two"}, "moe_top_k must be a number, got 'two'"),
    ({"num_experts": 8.5}, "num_experts must be a whole number, got 8.5"),
    ({"pad_vocab_size_multiple": -64}, "pad_vocab_size_multiple must be a positive whole number, got -64"),
    ({"rotary_emb_fraction": None}, "cannot reproduce rotary_emb_fraction 0.0 (only 1.0)"),  # missing: the default
    ({"prenorm": True}, "cannot reproduce prenorm True (only False)"),
    ({"mlp_fc1_bias": False}, "cannot reproduce mlp_fc1_bias False (only True)"),
    ({"n_embd": 30}, "n_embd 30 is not a multiple of n_head 4"),
    ({"hidden_size": 64}, "n_embd 32 and hidden_size 64 disagree"),
    ({"auto_map": {"AutoModel": "other--modeling.Model"}}, "cannot reproduce auto_map's AutoModel 'other--modeling"),
    ({"architectures": ["NomicBertForSequenceClassification"]}, "cannot reproduce architecture NomicBertForSeq"),
]


@pytest.mark.parametrize("change, fragment", MOE_REFUSED, ids=[str(i) for i in range(len(MOE_REFUSED))])
def test_nomic_moe_settings_its_code_would_not_run_are_refused_before_weights_load(built, tmp_path, change, fragment):
    message = refusal_before_weights_load(built.moe(), tmp_path / "refused", change)
    assert fragment in message and "\n" not in message


def test_nomic_moe_config_without_its_optional_keys_reads_as_its_code_defaults_them(built, tmp_path):
    """A missing setting is the published code's default (NomicBertConfig's over GPT2Config's), not transformers'
    nomic_bert's (layer_norm_epsilon 1e-5, rotary base 10000); hidden_size is GPT2Config's alias of n_embd; what its
    CPU path ignores (moe_impl) changes nothing; the vocabulary is padded to pad_vocab_size_multiple as it pads it."""
    folder = copy_checkpoint(built.moe(), tmp_path / "defaults")
    raw = json.loads((folder / "config.json").read_text())
    for key in ("layer_norm_epsilon", "rotary_emb_base", "moe_impl", "n_embd"):
        raw.pop(key)
    (folder / "config.json").write_text(json.dumps(raw | {"hidden_size": 32}))
    cfg = read_checkpoint(folder).config
    assert (cfg.layer_norm_eps, cfg.rope_theta, cfg.hidden_size, cfg.vocab_size) == (1e-5, 10_000.0, 32, 2048)
    assert (cfg.num_experts, cfg.top_k, cfg.moe_every_n_layers, cfg.qkv_bias) == (8, 2, 2, True)


# llama-nemotron-embed's config.json, as its folder has it: its own model_type and its published modelling code.
NEMOTRON = {"model_type": "llama_bidirec", "architectures": ["LlamaBidirectionalModel"], "pooling": "avg",
            "temperature": 1.0, "auto_map": {"AutoConfig": "llama_bidirectional_model.LlamaBidirectionalConfig",
                                             "AutoModel": "llama_bidirectional_model.LlamaBidirectionalModel"}}


def test_llama_bidirec_runs_as_its_published_code_every_query_seeing_every_real_key(built, tmp_path):
    """llama-nemotron-embed's LlamaBidirectionalModel (llama_bidirectional_model.py) is transformers' LlamaModel with
    every layer's is_causal false and the padding mask alone (_prepare_4d_attention_mask): the reference is LlamaModel
    over the same weights given that 4D mask. Its export encodes as that, mean-pooled ("avg") and normalised; another
    remote code is refused."""
    row = BY_NAME["llama"]
    folder = copy_checkpoint(built.st(row), tmp_path / "nemotron")  # the llama row's mean + Normalize pipeline
    edit_json(folder / "config.json", **NEMOTRON)
    ours = load_encoder(read_checkpoint(folder))
    assert not ours.config.causal and ours.config.family == "llama_bidirec"
    reference = transformers_model(built.model(row), "eager")
    padding_only = lambda mask: (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min  # noqa: E731
    for seed, lengths in enumerate(LENGTHS):
        for side in ("right", "left"):
            ids, mask, _ = batch(row, ours.config, lengths, seed, side)
            want = hidden(reference, ids, padding_only(mask), output_attentions=True)
            got, maps = hidden(ours, ids, mask, output_attentions=True)
            assert max_error(got, want.last_hidden_state, mask) <= 1e-4, (lengths, side)
            real = mask.bool()[:, None, :, None] & mask.bool()[:, None, None, :]  # (B, 1, T, T)
            assert float((maps - torch.stack(want.attentions)).abs()[:, real.expand(-1, maps.shape[2], -1, -1)]
                         .max()) <= 1e-5
    full = hidden(ours, *batch(row, ours.config, (30,), seed=0)[:2], output_attentions=True)[1]
    assert bool((full > 0).all())  # every key, before and after the query: not causal
    build_artifacts(read_checkpoint(folder), tmp_path / "out", log=lambda m: None, variants=["embeddings"])
    encoded = Engine.from_directory(tmp_path / "out").encode(TEXTS)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(row.max_seq_length)  # the text cut, its end-of-text token kept
    for text_tokens, embedding in zip(tokenizer.encode_batch(TEXTS), encoded.embeddings, strict=True):
        ids = torch.tensor([text_tokens.ids])
        mask = torch.ones_like(ids)
        pooled = hidden(reference, ids, padding_only(mask)).last_hidden_state.mean(1)[0].numpy()
        want = pooled / np.linalg.norm(pooled)
        assert np.abs(embedding - want).max() <= 1e-5 and cosines(embedding[None], want[None]).min() >= 0.99999
    edit_json(folder / "config.json", auto_map={"AutoModel": "someone--other_code.LlamaBidirectionalModel"})
    with pytest.raises(CheckpointError, match="cannot reproduce auto_map's AutoModel"):
        read_checkpoint(folder)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_a_rotary_models_left_padding_is_taken_where_its_pooling_reads_no_fixed_position(built, tmp_path, pooling):
    """A tokenizer that pads on the left (llama-nemotron-embed's kind): a rotary model's scores see only distances,
    so mean pooling gives what sentence-transformers gives on its left-padded batches; CLS pooling would read a pad
    there, and is refused."""
    from sentence_transformers import SentenceTransformer

    from .checkpoints import save_sentence_transformer

    st = save_sentence_transformer(built.model(BY_NAME["eurobert"]), tmp_path / "st", pooling, True, 40)
    edit_json(st / "tokenizer_config.json", padding_side="left")
    if pooling == "cls":
        with pytest.raises(CheckpointError, match="cannot reproduce padding_side 'left'"):
            build_artifacts(read_checkpoint(st), tmp_path / "out", log=lambda m: None, variants=["embeddings"])
        return
    build_artifacts(read_checkpoint(st), tmp_path / "out", log=lambda m: None, variants=["embeddings"])
    model = SentenceTransformer(str(st), device="cpu")
    assert model.tokenizer.padding_side == "left"
    got, want = Engine.from_directory(tmp_path / "out").encode(TEXTS).embeddings, model.encode(TEXTS)
    assert np.abs(got - want).max() <= 1e-5 and cosines(got, want).min() >= 0.99999


@pytest.mark.parametrize("settings", [
    {"position_biased_input": True, "type_vocab_size": 2, "embedding_size": 48},  # DeBERTa-v2's, and a projection
    {"pos_att_type": "c2p", "position_buckets": -1, "max_relative_positions": 24},  # v2's form, no buckets
    {"pos_att_type": ["p2c"], "norm_rel_ebd": "none"}])
def test_deberta_settings_v3_leaves_at_their_defaults_match_transformers(tmp_path, settings):
    """The DeBERTa-v2 options the v3 row does not use: absolute positions beside the relative ones, token types, the
    embedding projection, one position term alone in either config form, unbucketed distances, no table norm."""
    row = BY_NAME["deberta-v2"]
    model = row.save(tmp_path / "deberta", seed=3, **settings)
    encoder = load_encoder(read_checkpoint(model))
    types = encoder.config.has_token_types
    ids, mask, segments = batch(row, encoder.config, (40, 17, 1), seed=0, types=types)
    want = hidden(transformers_model(model, "eager"), ids, mask, segments).last_hidden_state
    assert max_error(hidden(encoder, ids, mask, segments)[0], want, mask) <= 1e-4


def test_modernbert_sequence_classifier_is_a_reranker(tmp_path):
    """A cross-encoder (tests/test_cross_encoder_families.py), where a token classifier's head is refused."""
    assert read_checkpoint(BY_NAME["modernbert"].save(tmp_path / "cls", model_class="ModernBertForSequenceClassif"
                                                      "ication")).kind == "reranker"


def test_qwen3_left_and_right_padding_give_the_same_outputs_and_pooling(built):
    from sentence_transformers.sentence_transformer.modules import Pooling

    ours = built.ours(BY_NAME["qwen3"])
    ids, right, _ = batch(BY_NAME["qwen3"], ours.config, (40, 17, 1), seed=4)
    # The same tokens with their padding moved before them.
    left_ids = torch.stack([torch.cat((row[~m.bool()], row[m.bool()])) for row, m in zip(ids, right, strict=True)])
    left = right.flip(1)
    from_right, from_left = hidden(ours, ids, right)[0], hidden(ours, left_ids, left)[0]
    assert float((from_right[right.bool()] - from_left[left.bool()]).abs().max()) <= 1e-4
    for mode in ("lasttoken", "mean"):
        np.testing.assert_allclose(pool(from_right, right, mode), pool(from_left, left, mode), atol=1e-4)
    for mask in (right, left):  # lasttoken pooling, as sentence-transformers' on either side
        theirs = Pooling(64, "lasttoken")({"token_embeddings": from_right, "attention_mask": mask})
        torch.testing.assert_close(pool(from_right, mask, "lasttoken"), theirs["sentence_embedding"], atol=0, rtol=0)
    # Every text ends in <|endoftext|>, whose hidden state is the embedding (sentence-transformers pads left).
    from tokenizers import Tokenizer

    from .tiny_qwen3 import END_OF_TEXT

    engine = Engine.from_directory(built.exported(BY_NAME["qwen3"])[0])
    end_of_text = Tokenizer.from_file(str(built.st(BY_NAME["qwen3"]) / "tokenizer.json")).token_to_id(END_OF_TEXT)
    assert engine.tokenizer.encode_texts(["hello world"])[0].ids[-1] == end_of_text
    assert built.sentence_transformer(BY_NAME["qwen3"]).tokenizer.padding_side == "left"


def test_qwen3_causal_lm_checkpoint_loads_its_encoder_and_biases_are_reproduced(tmp_path):
    """Qwen3ForCausalLM (keys under "model.", lm_head unused) with its sentence-transformers modules: an embedder."""
    from .tiny_qwen3 import save_qwen3_embedding, save_tiny_qwen3

    model = save_tiny_qwen3(tmp_path / "lm", model_class="Qwen3ForCausalLM", seed=1, attention_bias=True,
                            tie_word_embeddings=False)
    ckpt = read_checkpoint(save_qwen3_embedding(model, tmp_path / "st"))
    assert ckpt.kind == "embedder" and ckpt.modules == ["Transformer(qwen3)", "Pooling(lasttoken)", "Normalize"]
    encoder = load_encoder(ckpt)
    assert sum(name.endswith(".bias") for name, _ in encoder.named_parameters()) == 3 * 4
    ids, mask, _ = batch(BY_NAME["qwen3"], encoder.config, (30, 11), seed=0, side="left")
    assert max_error(hidden(encoder, ids, mask)[0], hidden(transformers_model(model, "sdpa"), ids, mask)
                     .last_hidden_state, mask) <= 1e-4


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_gemma3_causal_matches_transformers(tmp_path, implementation):
    """use_bidirectional_attention false: a decoder, causal in every layer, and the sliding layers see the
    sliding_window - 1 keys before a query (the window is not halved)."""
    row = BY_NAME["gemma3_text"]
    model = row.save(tmp_path / "causal", seed=2, use_bidirectional_attention=False)
    encoder = load_encoder(read_checkpoint(model))
    assert not encoder.config.bidirectional
    reference = transformers_model(model, implementation)
    for seed, lengths in enumerate(LENGTHS[1:4]):
        ids, mask, _ = batch(row, encoder.config, lengths, seed)
        assert max_error(hidden(encoder, ids, mask)[0], hidden(reference, ids, mask).last_hidden_state, mask) <= 1e-4
    ids, mask, _ = batch(row, encoder.config, (20, 11), seed=0)
    maps = hidden(encoder, ids, mask, output_attentions=True)[1]
    offset, sliding = torch.arange(20)[None, :] - torch.arange(20)[:, None], list(row.window[0])  # key - query
    assert torch.count_nonzero(maps[:, 0][..., offset > 0]) == 0  # lower-triangular
    assert torch.count_nonzero(maps[sliding, 0][..., offset <= -8]) == 0
    assert bool((maps[sliding, 0][..., (offset <= 0) & (offset > -8)] > 0).all())
    assert torch.count_nonzero(maps[:, 1, :, :, 11:]) == 0  # padded keys


def test_gemma3_attn_logit_softcapping_is_left_unapplied_as_transformers_does(built, tmp_path):
    row = BY_NAME["gemma3_text"]
    capped = shutil.copytree(built.model(row), tmp_path / "capped")
    edit_json(capped / "config.json", attn_logit_softcapping=0.5, final_logit_softcapping=1.0)
    encoder, reference = load_encoder(read_checkpoint(capped)), transformers_model(capped, "eager")
    for seed, lengths in enumerate(LENGTHS[2:4]):
        ids, mask, _ = batch(row, encoder.config, lengths, seed)
        assert max_error(hidden(encoder, ids, mask)[0], hidden(reference, ids, mask).last_hidden_state, mask) <= 1e-4


def jina(directory: Path, task: str | None):
    """(ours, transformers' JinaEmbeddingsV3Model) with the task's adapter: merged by us, loaded by transformers'
    PEFT integration (the one adapter loaded is the active one; PEFT forbids dots in adapter names)."""
    import transformers

    ckpt = read_checkpoint(directory)
    models = []
    for implementation in ("eager", "sdpa"):
        model = transformers.JinaEmbeddingsV3Model.from_pretrained(str(directory), attn_implementation=implementation)
        if task is not None:
            model.load_adapter(str(directory / "adapters" / task), adapter_name=task.replace(".", "_"))
        models.append(model.eval())
    return load_encoder(dataclasses.replace(ckpt, config=with_task(ckpt.config, task))), models


@pytest.mark.parametrize("task", [None, *TASKS])
def test_jina_last_hidden_state_and_maps_match_transformers_with_the_tasks_adapter(built, task):
    row = BY_NAME["jina_embeddings_v3"]
    encoder, references = jina(built.model(row), task)
    ids, mask, _ = batch(row, encoder.config, (23, 9, 1), seed=1)
    got, maps = hidden(encoder, ids, mask, output_attentions=True)
    for reference in references:
        want = hidden(reference, ids, mask, output_attentions=reference is references[0])
        assert max_error(got, want.last_hidden_state, mask) <= 1e-4
    rows = mask.bool()[:, None, :, None] & mask.bool()[:, None, None, :]
    for layer, theirs in enumerate(hidden(references[0], ids, mask, output_attentions=True).attentions):
        assert float((maps[layer] - theirs).abs()[rows.expand_as(theirs)].max()) <= 1e-5
    if task is not None:  # the adapter matters: the check above could not pass with the base weights
        assert max_error(got, hidden(built.ours(row), ids, mask)[0], mask) > 0.5


@pytest.mark.parametrize("task", [None, *TASKS])
def test_jina_each_tasks_graphs_are_verified_and_encode_as_sentence_transformers(built, task):
    """sentence-transformers loads JinaEmbeddingsV3Model without remote code; a task's adapter goes in through
    transformers' load_adapter on its Transformer module. The task's fp32 graph matches PyTorch with that adapter
    at sizes the export did not trace or verify with."""
    from sentence_transformers import SentenceTransformer

    row = BY_NAME["jina_embeddings_v3"]
    manifest = load_manifest(built.exported(row)[0])
    assert manifest.tasks == TASKS and manifest.task is None
    sub = load_manifest(task_directory(manifest, task))  # checks every file's sha256
    assert sub.task == task and sub.tasks == (() if task else TASKS)
    for name in ("embeddings", "embeddings_fused", "attention"):
        assert sub.variants[name].parity["max_abs_last_hidden_state"] <= 1e-4
    assert sub.variants["attention"].parity["max_padded_key_weight"] == 0
    assert sub.variants["embeddings_fp16"].parity["min_cosine_sentence_embedding"] >= 0.999
    engine = Engine.from_directory(task_directory(manifest, task))
    encoder = jina(built.st(row), task)[0] if task else built.ours(row)
    for seed, lengths in enumerate(((31,), (7, 38, 2), (13, 13, 13, 1, 29))):
        ids, mask, _ = batch(row, encoder.config, lengths, seed)
        got = engine._session.run(["last_hidden_state"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        assert max_error(torch.from_numpy(got[0]), hidden(encoder, ids, mask)[0], mask) <= 1e-4
    model = SentenceTransformer(str(built.st(row)), device="cpu")
    if task is not None:
        model[0].auto_model.load_adapter(str(built.st(row) / "adapters" / task), adapter_name=task.replace(".", "_"))
    assert cosines(engine.encode(TEXTS).embeddings, model.encode(TEXTS)).min() >= 0.99999


def test_jina_a_task_is_refused_by_a_model_without_adapters_and_an_unknown_one_by_any(built, tmp_path):
    manifest = load_manifest(built.exported(BY_NAME["jina_embeddings_v3"])[0])
    with pytest.raises(InvalidInputError, match="has no task adapters") as refused:
        task_directory(dataclasses.replace(manifest, tasks=()), "retrieval.query")
    assert "\n" not in str(refused.value)
    with pytest.raises(InvalidInputError, match="'retrieval' is not one of .*tasks: retrieval.query, "):
        task_directory(manifest, "retrieval")
    # `encode --task` writes the task's vectors offline, and refuses an unknown task in one line.
    import pyarrow.parquet as pq

    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS[:3]) + "\n")
    result = run_cli("encode", source, "-o", tmp_path / "out.parquet", "--artifacts", manifest.directory, "--task",
                     "separation", "--no-progress")
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.stack(pq.read_table(tmp_path / "out.parquet")["embedding"].to_numpy(
        zero_copy_only=False)), Engine.from_directory(task_directory(manifest, "separation")).encode(TEXTS[:3])
        .embeddings, atol=2e-6)
    assert_one_line_error(run_cli("encode", source, "-o", tmp_path / "bad.parquet", "--artifacts",
                                  manifest.directory, "--task", "summarize"), "'summarize' is not one of")


# NV-Embed: its published modelling code is not in this repository (NVIDIA's, CC-BY-NC-4.0); expected.npz holds what
# it gives over the tiny checkpoint, made by tests/reference/nvembed/make_expected.py, which says how.
NVEMBED_EXPECTED = Path(__file__).parent / "reference" / "nvembed" / "expected.npz"


@pytest.fixture(scope="module")
def nvembed(tmp_path_factory):
    """The tiny NV-Embed folder, its fp32 export, and the published code's outputs over it."""
    from .tiny_nvembed import save_tiny_nvembed, weights

    expected = dict(np.load(NVEMBED_EXPECTED))
    # The folder drawn here must be the one the expected outputs were made from.
    assert float(expected["weights_checksum"]) == pytest.approx(sum(float(w.abs().sum()) for w in weights().values()),
                                                                rel=1e-6)
    folder = save_tiny_nvembed(tmp_path_factory.mktemp("nvembed") / "NV-Embed-tiny")
    out = folder.parent / "out"
    build_artifacts(read_checkpoint(folder), out, log=lambda m: None, variants=list(FP32))
    return folder, out, expected


def _eos(texts):
    """NVEmbedModel.encode appends the end-of-text token to every text (always_add_eos); a caller of
    sentence-transformers or attnserve appends it to the text, as the model card's example does."""
    return [t + "</s>" for t in texts]


def test_nvembed_runs_as_its_published_code_the_instruction_left_out_of_the_pooling(nvembed):
    """NVEmbedModel over the same weights (expected.npz): each token's output of the latent attention layer (the
    bidirectional Mistral beneath, its sliding_window not applied), in PyTorch and from the exported graph; and
    encode()'s embeddings, of documents and of queries after the model card's instruction, whose tokens encode leaves
    out of the pooling: the engine's, with the prompt by name and given raw, cosine >= 0.99999."""
    from attnserve.server.workers.wire import pack_inputs, unpack_inputs

    from .tiny_nvembed import INSTRUCTION

    folder, out, expected = nvembed
    engine = Engine.from_directory(out)
    assert engine.manifest.family == "nvembed" and not engine.manifest.include_prompt
    assert not engine.manifest.late_chunkable  # the graph alone knows which tokens are the prompt's
    token_texts = _eos(TEXTS[3:])
    inputs = engine.tokenizer.encode_texts(token_texts)
    mask = expected["token_mask"].astype(bool)
    for name, texts in (("token", token_texts), ("document", _eos(TEXTS)),
                        ("query", [INSTRUCTION + t for t in _eos(TEXTS)])):  # the same tokens as encode() ran
        real = expected[f"{name}_mask"].astype(bool)
        for row, x in enumerate(engine.tokenizer.encode_texts(texts)):
            assert x.ids.tolist() == expected[f"{name}_ids"][row][real[row]].tolist(), (name, row)
    ids, attention = torch.tensor(expected["token_ids"]), torch.tensor(expected["token_mask"])
    with torch.no_grad():
        tokens = load_encoder(read_checkpoint(folder))(ids, attention)[0].numpy()
    assert np.abs(tokens[mask] - expected["tokens"][mask]).max() <= 1e-4
    graph = engine.run(inputs).last_hidden_state  # (N, T, H), the engine's right padding
    assert np.abs(graph[:, :mask.shape[1]][mask] - expected["tokens"][mask]).max() <= 1e-4
    documents = engine.encode(_eos(TEXTS)).embeddings
    assert np.abs(documents - expected["documents"]).max() <= 1e-5
    assert cosines(documents, expected["documents"]).min() >= 0.99999
    assert engine.tokenizer.prompt_length(INSTRUCTION) == int(expected["instruction_tokens"])
    marked = engine.tokenizer.encode_texts([INSTRUCTION + t for t in _eos(TEXTS[:2])], unpooled_prompt=INSTRUCTION)
    unpacked = unpack_inputs(*pack_inputs(marked))  # as a worker process gets them
    assert [x.unpooled for x in unpacked] == [int(expected["instruction_tokens"])] * 2
    for asked in ({"prompt_name": "query"}, {"prompt": INSTRUCTION}):
        queries = engine.encode(_eos(TEXTS), **asked).embeddings
        assert np.abs(queries - expected["queries"]).max() <= 1e-5
        assert cosines(queries, expected["queries"]).min() >= 0.99999, asked
    assert cosines(queries, documents).max() < 0.999  # the instruction changes what is attended to and pooled


def test_nvembed_every_door_and_offline_encode_leave_the_instruction_out_as_its_code_does(nvembed, tmp_path):
    """A real `attnserve serve` over the export: gRPC Embed, OpenAI's client, TEI's /embed, Cohere's /v2/embed
    (input_type search_query) and KServe's infer, each with the prompt by name, and `attnserve encode
    --prompt-name`, all give encode()'s query embeddings (expected.npz); a prompt that leaves the text no token,
    and a prompt with left truncation, are refused in one line."""
    import httpx
    import openai
    import pyarrow.parquet as pq

    from attnserve.client.client import make_request, to_result

    from .serving import ServerProcess, serving

    _, out, expected = nvembed
    texts, want = _eos(TEXTS), expected["queries"]
    with serving(ServerProcess(None, "--model", f"nvembed={out}", log_path=tmp_path / "log")) as server:
        with server.channel() as channel:
            reply = server.stub(channel).Embed(make_request(texts, truncate=True, prompt_name="query"), timeout=60)
            got = {"grpc": np.stack([to_result(e).sentence_embedding for e in reply.embeddings])}
        client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused")
        reply = client.embeddings.create(model="nvembed", input=texts, extra_body={"prompt_name": "query"})
        got["openai"] = np.array([d.embedding for d in reply.data])
        url = server.http_url
        got["tei"] = np.array(httpx.post(f"{url}/embed", json={"inputs": texts, "prompt_name": "query"},
                                         timeout=60).json())
        cohere = httpx.post(f"{url}/v2/embed", json={"model": "nvembed", "texts": texts, "input_type": "search_query",
                                                     "embedding_types": ["float"]}, timeout=60)
        assert cohere.status_code == 200, cohere.text
        got["cohere"] = np.array(cohere.json()["embeddings"]["float"])
        kserve = httpx.post(f"{url}/v2/models/nvembed/infer", json={
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}],
            "parameters": {"prompt_name": "query"}}, timeout=60)
        assert kserve.status_code == 200, kserve.text
        embedding = next(o for o in kserve.json()["outputs"] if o["name"] == "embedding")
        got["kserve"] = np.array(embedding["data"], np.float32).reshape(len(texts), -1)
        for door, embeddings in got.items():
            assert np.abs(embeddings - want).max() <= 1e-5 and cosines(embeddings, want).min() >= 0.99999, door
        filled = httpx.post(f"{url}/embed", json={"inputs": ["x"], "prompt": "word " * 200}, timeout=60)
        assert filled.status_code in (400, 413) and "no token of the text is left to pool" in filled.text
        left = httpx.post(f"{url}/embed", json={"inputs": ["word " * 200], "prompt_name": "query",
                                                "truncation_direction": "Left"}, timeout=60)
        assert left.status_code in (400, 413) and "truncation from the left cut into the prompt" in left.text
    source = tmp_path / "texts.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    result = run_cli("encode", source, "-o", tmp_path / "q.parquet", "--artifacts", out, "--prompt-name", "query",
                     "--no-progress")
    assert result.returncode == 0, result.stderr
    offline = np.array(pq.read_table(tmp_path / "q.parquet").column("embedding").to_pylist(), np.float32)
    assert np.abs(offline - want).max() <= 1e-5 and cosines(offline, want).min() >= 0.99999


@pytest.mark.parametrize(("change", "says"), [
    ({"text_config": {"model_type": "mistral"}}, "cannot reproduce text_config 'mistral'"),
    ({"latent_attention_config": {"model_type": "latent_attention", "hidden_dim": 32}},
     "cannot reproduce latent_attention_config hidden_dim 32"),
    ({"latent_attention_config": {"num_latents_value": 0}}, "sizes must be positive integers"),
    ({"auto_map": {"AutoModel": "someone--modeling_other.NVEmbedModel"}}, "cannot reproduce auto_map's AutoModel"),
    ({"architectures": ["NVEmbedForSomething"]}, "cannot reproduce architecture NVEmbedForSomething"),
    ({"is_mask_instruction": False}, "cannot reproduce include_prompt false with is_mask_instruction"),
    ({"padding_side": "left"}, "cannot reproduce include_prompt false with is_mask_instruction"),
    ({"1_Pooling/config.json": {"pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}},
     "include_prompt false (prompt tokens left out of the pooling) with pooling cls (only mean)"),
    ({"1_Pooling/config.json": {"include_prompt": "no"}}, "include_prompt must be true or false"),
])
def test_nvembed_refuses_in_one_line_what_its_code_would_not_run_so(tmp_path, change, says):
    from .tiny_nvembed import save_tiny_nvembed

    folder = save_tiny_nvembed(tmp_path / "nvembed")
    for key, value in change.items():
        if "/" in key:
            edit_json(folder / key, **value)
        elif key == "text_config":
            raw = json.loads((folder / "config.json").read_text())
            edit_json(folder / "config.json", text_config={**raw["text_config"], **value})
        else:
            edit_json(folder / "config.json", **{key: value})
    with pytest.raises(CheckpointError, match="^[^\n]*$") as refused:
        read_checkpoint(folder)
    assert says in str(refused.value)


# Static embeddings (model/static_embedding.py): no transformers class, so no table row. Each folder is held to the
# library that wrote it (model2vec's StaticModel.encode, sentence-transformers' SentenceTransformer.encode) at max
# abs 1e-6: unknown words (model2vec drops [UNK]), emoji, a text model2vec cuts by characters, one no tokenizer
# keeps anything of, and one past the served length that --long-inputs chunk answers whole.
STATIC_TEXTS = [*TEXTS, "zzqx qq 🙂🙂 unknown", "🙂🚀", "ab cd " * 300, "word " * 4500]
STATIC_SAVERS = {"model2vec": lambda d: save_model2vec(d),
                 "model2vec_quantized": lambda d: save_model2vec(d, seed=1, normalize=False, max_length=None,
                                                                 quantized=True),
                 "static_embedding": lambda d: save_static_embedding(d, seed=2)}


@pytest.fixture(scope="module")
def statics(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """name -> (the library's folder, its fp32 export)."""
    root, out = tmp_path_factory.mktemp("static"), {}
    for name, save in STATIC_SAVERS.items():
        folder = save(root / name)
        build_artifacts(read_checkpoint(folder), root / name / "artifacts", log=lambda line: None,
                        variants=["embeddings"])
        out[name] = folder, root / name / "artifacts"
    return out


def _static_reference(folder: Path, texts: list[str]) -> np.ndarray:
    """The library the folder was written by, encoding texts as its users run it."""
    if (folder / "config_sentence_transformers.json").exists():
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(str(folder), device="cpu").encode(texts)
    from model2vec import StaticModel

    return StaticModel.from_pretrained(folder).encode(texts)


def test_static_embeddings_encode_as_the_library_that_wrote_them(statics):
    from model2vec import StaticModel

    for name, (folder, out) in statics.items():
        manifest = load_manifest(out)
        assert manifest.num_layers == 0 and set(manifest.variants) == {"embeddings"}, name
        encoded = Engine.from_directory(out).encode(STATIC_TEXTS[:-1])
        assert np.abs(encoded.embeddings - _static_reference(folder, STATIC_TEXTS[:-1])).max() <= 1e-6, name
        if name.startswith("model2vec"):  # its tokens: cut at its characters and tokens, [UNK] dropped
            model = StaticModel.from_pretrained(folder)
            limit = manifest.static["char_limit"] or None  # type: ignore[index]
            cut = [t[:limit] for t in STATIC_TEXTS[:-1]]
            assert encoded.num_tokens.tolist() == [min(len(ids), model.max_length or len(ids))
                                                   for ids in model.tokenize(cut)], name
    model2vec = Engine.from_directory(statics["model2vec"][1]).encode(STATIC_TEXTS[-4:-1])
    assert model2vec.num_tokens[1] == 0 and not model2vec.embeddings[1].any()  # only unknown: zeros, as model2vec
    assert model2vec.truncated.tolist() == [False, False, True]  # "ab cd " * 300: past its 48 characters


def test_static_embeddings_offline_and_their_refusals(statics, tmp_path):
    import pyarrow.parquet as pq

    folder, out = statics["model2vec_quantized"]
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(STATIC_TEXTS[:-1]) + "\n")
    result = run_cli("encode", source, "-o", tmp_path / "out.parquet", "--artifacts", out, "--no-progress")
    assert result.returncode == 0, result.stderr
    got = np.stack(pq.read_table(tmp_path / "out.parquet")["embedding"].to_numpy(zero_copy_only=False))
    assert np.abs(got - _static_reference(folder, STATIC_TEXTS[:-1])).max() <= 1e-6
    for precision in ("int8", "fp16"):
        assert_one_line_error(run_cli("encode", source, "-o", tmp_path / "x.parquet", "--artifacts", out,
                                      "--precision", precision), f"has no {precision} graph", "static")
    # Malformed folders, refused in one line before anything loads.
    from safetensors.numpy import load_file, save_file

    def broken(name: str, change) -> Path:
        copy = copy_checkpoint(statics[name][0], tmp_path / f"broken-{len(list(tmp_path.iterdir()))}")
        change(copy)
        return copy

    def tensors(key: str, value):
        def change(copy: Path) -> None:
            weights = load_file(copy / "model.safetensors")
            weights[key] = value(weights[key]) if callable(value) else value
            if weights[key] is None:
                del weights[key]
            save_file(weights, copy / "model.safetensors")
        return change

    # model2vec's int8 table (quantize_to="int8": integers, no scale) is read into the fp32 graph exactly.
    from model2vec import StaticModel
    from model2vec.model import quantize_model

    quantize_model(StaticModel.from_pretrained(statics["model2vec"][0]), quantize_to="int8").save_pretrained(
        tmp_path / "int8")
    build_artifacts(read_checkpoint(tmp_path / "int8"), tmp_path / "int8-artifacts", log=lambda line: None,
                    variants=["embeddings"])
    assert np.abs(Engine.from_directory(tmp_path / "int8-artifacts").encode(STATIC_TEXTS[:-1]).embeddings
                  - _static_reference(tmp_path / "int8", STATIC_TEXTS[:-1])).max() <= 1e-6
    # The published potion models' config.json (model_type model2vec, distillation settings, no max_length).
    potion = broken("model2vec", lambda c: (c / "config.json").write_text(json.dumps({
        "model_type": "model2vec", "architectures": ["StaticModel"], "tokenizer_name": "baai/bge-base-en-v1.5",
        "apply_pca": 256, "apply_zipf": True, "hidden_dim": 256, "seq_length": 1000000, "normalize": True})))
    config = read_checkpoint(potion).config
    assert (config.library, config.max_length) == ("model2vec", 512)  # type: ignore[attr-defined]
    # A max_length past what is served at once sizes nothing: it is served up to 8,192 tokens (then --long-inputs).
    huge = read_checkpoint(broken("model2vec", lambda c: edit_json(c / "config.json", max_length=10**9)))
    assert huge.max_seq_length == 8192 and huge.config.char_limit > 10**9  # type: ignore[attr-defined]
    for name, change, says in [
        ("model2vec_quantized", tensors("mapping", lambda m: m + 40), "mapping points outside the 40 rows"),
        ("model2vec_quantized", tensors("weights", lambda w: w[:-1]), "weights has shape (199,)"),
        ("model2vec", tensors("embeddings", lambda e: e[:-1]), "embeddings has 199 rows for 200 tokens"),
        ("model2vec", tensors("embeddings", lambda e: e[:, :, None]), "must be a (tokens, dimensions) matrix"),
        ("static_embedding", tensors("embedding.weight", lambda e: e[:10]), "reach 199"),
        ("static_embedding", tensors("embedding.weight", None), "holds embedding.weight"),
        ("model2vec", lambda c: edit_json(c / "config.json", max_length=0), "max_length must be a positive"),
        ("static_embedding", lambda c: (c / "modules.json").write_text(json.dumps(
            [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.StaticEmbedding"},
             {"idx": 1, "name": "1", "path": "1_Dense", "type": "sentence_transformers.models.Dense"}])),
         "StaticEmbedding -> Dense"),
    ]:
        assert_one_line_error(run_cli("export", "--checkpoint", broken(name, change), "--out", tmp_path / "none"),
                              says)


def test_static_embeddings_on_every_embedding_door(statics, tmp_path):
    """One server over the three models with --long-inputs chunk: gRPC Embed, OpenAI, TEI, Cohere and KServe v2
    against each library; a text past the 8,192 tokens served at once answered whole (a mean of windows' means,
    weighted by their tokens, is the mean); attention refused in one line on gRPC and /v1/attention."""
    import grpc
    import httpx

    from attnserve.client.client import make_request, to_result

    from .serving import ServerProcess, serving

    texts = STATIC_TEXTS[:3] + STATIC_TEXTS[-4:-2]
    # The sentence-transformers folder given as it is (a checkpoint with modules.json and no config.json): exported
    # by the server, once.
    flags = [f for name, (folder, out) in statics.items()
             for f in ("--model", f"{name}={folder if name == 'static_embedding' else out}")]
    with serving(ServerProcess(None, *flags, "--long-inputs", "chunk", log_path=tmp_path / "log")) as server:
        url = server.http_url
        with server.channel() as channel:
            stub = server.stub(channel)
            for name, (folder, _) in statics.items():
                expected = _static_reference(folder, texts)
                # truncate true: cut where the library cuts (model2vec), never chunked
                reply = stub.Embed(make_request(texts, truncate=True, model=name), timeout=60)
                got = np.stack([to_result(e).sentence_embedding for e in reply.embeddings])
                assert np.abs(got - expected).max() <= 1e-6, name
                openai = httpx.post(f"{url}/v1/embeddings", json={"input": texts, "model": name, "truncate": True,
                                                                   "encoding_format": "float"}, timeout=60)
                # OpenAI's and TEI's (normalize unset: true) are unit vectors, whatever the model's pipeline says.
                unit = expected / np.maximum(np.linalg.norm(expected, axis=1, keepdims=True), 1e-12)
                assert np.abs(np.array([d["embedding"] for d in openai.json()["data"]]) - unit).max() <= 1e-6
                tei = httpx.post(f"{url}/embed", json={"inputs": texts, "model": name, "truncate": True}, timeout=60)
                assert tei.status_code == 200 and np.abs(np.array(tei.json()) - unit).max() <= 1e-6, tei.text
                cohere = httpx.post(f"{url}/v2/embed", json={"model": name, "texts": texts, "input_type":
                                                             "search_document", "embedding_types": ["float"]},
                                    timeout=60)
                assert cohere.status_code == 200, cohere.text
                assert np.abs(np.array(cohere.json()["embeddings"]["float"]) - expected).max() <= 1e-6
                kserve = httpx.post(f"{url}/v2/models/{name}/infer", json={"parameters": {"truncate": True}, "inputs": [
                    {"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}, timeout=60)
                out = next(o for o in kserve.json()["outputs"] if o["name"] == "embedding")
                assert np.abs(np.array(out["data"]).reshape(out["shape"]) - expected).max() <= 1e-6
            # Past the served length: chunked exactly where sentence-transformers reads the whole text.
            folder = statics["static_embedding"][0]
            reply = stub.Embed(make_request(STATIC_TEXTS[-1:], model="static_embedding"), timeout=60)
            from tokenizers import Tokenizer

            tokens = len(Tokenizer.from_file(str(folder / "tokenizer.json")).encode(
                STATIC_TEXTS[-1], add_special_tokens=False).ids)
            assert reply.embeddings[0].num_tokens == tokens > 2 * 8192 and reply.embeddings[0].windows == 3
            got = to_result(reply.embeddings[0]).sentence_embedding
            # The exact mean (float64) of the table's rows: sentence-transformers' own fp32 EmbeddingBag drifts 2e-5
            # from it over 18,000 tokens, so 1e-6 to the library holds for texts of hundreds of tokens, not this.
            from safetensors.numpy import load_file

            table = load_file(folder / "model.safetensors")["embedding.weight"].astype(np.float64)
            exact = table[Tokenizer.from_file(str(folder / "tokenizer.json")).encode(
                STATIC_TEXTS[-1], add_special_tokens=False).ids].mean(0)
            exact /= np.linalg.norm(exact)
            library = _static_reference(folder, STATIC_TEXTS[-1:])[0]
            print("long text: max abs to the exact mean", np.abs(got - exact).max(), "the library's",
                  np.abs(library - exact).max())
            assert np.abs(got - exact).max() <= 2 * max(np.abs(library - exact).max(), 1e-6)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Embed(make_request(texts[:1], attention_layers=[-1], model="model2vec"), timeout=60)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "static embedding model" in refused.value.details() and "\n" not in refused.value.details()
        # Late chunking: a chunk's tokens' rows averaged, as the library embeds the chunk's text (no context to add).
        document = "Hello there. Zzz 🙂 world, again!"
        chunks = httpx.post(f"{url}/embed_chunks", json={"inputs": [document], "chunker": "sentences",
                                                         "model": "model2vec"}, timeout=60)
        assert chunks.status_code == 200, chunks.text
        spans = [(c["start"], c["stop"]) for c in chunks.json()[0]["chunks"]]
        assert spans == [(0, 12), (13, len(document))]
        expected = _static_reference(statics["model2vec"][0], [document[a:b] for a, b in spans])
        got = np.array([c["embedding"] for c in chunks.json()[0]["chunks"]])
        assert np.abs(got - expected).max() <= 1e-6
        attention = httpx.post(f"{url}/v1/attention", json={"inputs": "hello world", "model": "static_embedding"})
        assert attention.status_code == 400 and "has no attention" in attention.text, attention.text
