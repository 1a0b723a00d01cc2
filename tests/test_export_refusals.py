"""Checkpoints whose pipeline the export cannot reproduce are refused, in one line, before any tracing.

Each case is a real checkpoint folder: all-MiniLM-L6-v2 with one thing changed the way a real
checkpoint would have it (a Dense module saved by sentence-transformers' own Dense class, another
pooling mode, a head in config.json...), or a tiny random-weight model saved by transformers.
`attnserve export` must exit non-zero with exactly one line naming what it cannot reproduce, and
leave no output directory behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnserve.errors import CheckpointError
from attnserve.model.checkpoint import read_checkpoint

from .checkpoints import copy_checkpoint, edit_json, save_tiny_bert
from .conftest import assert_one_line_error, run_cli


def add_dense(ckpt: Path) -> None:
    """all-MiniLM-L6-v2 + Dense(384 -> 256) before Normalize, as sentence-transformers saves it."""
    import torch
    from sentence_transformers.sentence_transformer.modules import Dense

    torch.manual_seed(0)
    (ckpt / "2_Dense").mkdir()
    Dense(384, 256).save(str(ckpt / "2_Dense"))
    modules = json.loads((ckpt / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (ckpt / "modules.json").write_text(json.dumps(modules))


def pooling(**changes):
    return lambda ckpt: edit_json(ckpt / "1_Pooling" / "config.json", **changes)


def legacy_modes(*modes: str):
    keys = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "max": "pooling_mode_max_tokens"}
    return pooling(**{key: mode in modes for mode, key in keys.items()})


def reorder_normalize_first(ckpt: Path) -> None:
    modules = json.loads((ckpt / "modules.json").read_text())
    (ckpt / "modules.json").write_text(json.dumps([modules[0], modules[2], modules[1]]))


# (case, change to all-MiniLM-L6-v2, fragments the one error line must hold)
CASES = [
    ("dense module", add_dense, ["2_Dense", "Dense", "only Transformer, Pooling and Normalize"]),
    ("max pooling", legacy_modes("max"), ["pooling mode 'max'"]),
    ("mean_sqrt_len_tokens", pooling(pooling_mode="mean_sqrt_len_tokens"), ["'mean_sqrt_len_tokens'"]),
    ("weightedmean", pooling(pooling_mode="weightedmean"), ["'weightedmean'"]),
    ("lasttoken", pooling(pooling_mode="lasttoken"), ["'lasttoken'"]),
    ("cls and mean at once", legacy_modes("cls", "mean"), ["cls + mean"]),
    ("several modes, new style", pooling(pooling_mode=["mean", "max"]), ["mean + max"]),
    ("include_prompt false", pooling(include_prompt=False), ["include_prompt false"]),
    ("normalize before pooling", reorder_normalize_first, ["Transformer -> Normalize -> Pooling"]),
    ("classifier architecture",
     lambda c: edit_json(c / "config.json", architectures=["BertForSequenceClassification"]),
     ["architecture BertForSequenceClassification"]),
    ("albert model type", lambda c: edit_json(c / "config.json", model_type="albert"), ["model_type 'albert'"]),
    ("a cross-encoder pipeline", lambda c: edit_json(c / "config_sentence_transformers.json",
                                                     model_type="CrossEncoder"), ["model_type 'CrossEncoder'"]),
    ("default prompt", lambda c: edit_json(c / "config_sentence_transformers.json", prompts={"query": "query: "},
                                           default_prompt_name="query"), ["default_prompt_name 'query'"]),
    ("truncate_dim", lambda c: edit_json(c / "config_sentence_transformers.json", truncate_dim=128),
     ["truncate_dim 128"]),
    ("do_lower_case", lambda c: edit_json(c / "sentence_bert_config.json", do_lower_case=True), ["do_lower_case"]),
    ("max_seq_length past the positions", lambda c: edit_json(c / "sentence_bert_config.json", max_seq_length=1024),
     ["max_seq_length 1024", "512 positions"]),
    ("masked-LM task", lambda c: edit_json(c / "sentence_bert_config.json", transformer_task="fill-mask"),
     ["transformer_task \"fill-mask\""]),
    # transformers' BertTokenizer rebuilds its normalizer from tokenizer_config.json: here it stops
    # lowercasing, while tokenizer.json still lowercases. Caught by comparing the two tokenizers.
    ("tokenizer_config disagrees with tokenizer.json",
     lambda c: edit_json(c / "tokenizer_config.json", do_lower_case=False), ["tokenizer.json", "BertTokenizer"]),
    ("left padding", lambda c: edit_json(c / "tokenizer_config.json", padding_side="left"), ["padding_side 'left'"]),
]


@pytest.fixture
def minilm_copy(checkpoint, tmp_path) -> Path:
    return copy_checkpoint(checkpoint.directory, tmp_path / "ckpt")


@pytest.mark.parametrize("change,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_export_refuses_in_one_line(minilm_copy, tmp_path, change, fragments):
    change(minilm_copy)
    out = tmp_path / "out"
    assert_one_line_error(run_cli("export", "--checkpoint", minilm_copy, "--out", out), *fragments)
    assert not out.exists() and not list(tmp_path.glob(".out.building-*"))


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory) -> Path:
    """A real BertForSequenceClassification, as transformers saves it: its classifier is the output."""
    return save_tiny_bert(tmp_path_factory.mktemp("cross") / "ckpt", model_class="BertForSequenceClassification")


def test_a_cross_encoder_is_refused_naming_its_head(cross_encoder, tmp_path):
    result = run_cli("export", "--checkpoint", cross_encoder, "--out", tmp_path / "out")
    assert_one_line_error(result, "architecture BertForSequenceClassification")
    assert not (tmp_path / "out").exists()


def test_classifier_weights_are_refused_whatever_config_json_says(cross_encoder, tmp_path):
    relabelled = copy_checkpoint(cross_encoder, tmp_path / "ckpt")
    edit_json(relabelled / "config.json", architectures=["BertModel"])
    result = run_cli("export", "--checkpoint", relabelled, "--out", tmp_path / "out")
    assert_one_line_error(result, "model.safetensors", "head classifier.*")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("modules", [
    [{"path": "", "type": "sentence_transformers.models.Transformer"}],
    [{"path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
     {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}],
    [{"path": "", "type": "my_package.CustomTransformer"}, {"path": "1_Pooling", "type": "x.Pooling"}],
    [{"path": "", "type": "sentence_transformers.models.Transformer", "kwargs": ["task"]},
     {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}],
], ids=["no pooling", "transformer in a subfolder", "custom classes", "forward kwargs"])
def test_other_module_layouts_are_refused(minilm_copy, modules):
    (minilm_copy / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CheckpointError, match="cannot reproduce"):
        read_checkpoint(minilm_copy)
