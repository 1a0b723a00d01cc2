"""Checkpoints whose pipeline the export cannot reproduce are refused, in one line, before any tracing.

Each case is a real checkpoint folder: all-MiniLM-L6-v2 with one thing changed the way a real
checkpoint would have it (a Dense module saved by sentence-transformers' own Dense class with an
activation the export cannot write, a head in config.json...), or a tiny random-weight model saved by transformers.
`attnserve export` must exit non-zero with exactly one line naming what it cannot reproduce, and
leave no output directory behind; where the checkpoint's reading refuses it, its error is that one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnserve.errors import CheckpointError
from attnserve.model.checkpoint import read_checkpoint

from .checkpoints import add_module, copy_checkpoint, edit_json, save_tiny_bert
from .conftest import assert_one_line_error, run_cli


def add_dense(position: int = 2, in_features: int = 384, **changes):
    """all-MiniLM-L6-v2 + a Dense module saved by sentence-transformers' Dense, then its config changed."""
    def change(ckpt: Path) -> None:
        import torch
        from sentence_transformers.sentence_transformer.modules import Dense

        torch.manual_seed(0)
        add_module(ckpt, position, "2_Dense", Dense(in_features, 256))
        edit_json(ckpt / "2_Dense" / "config.json", **changes)
    return change


def dense_with_pickle_weights(ckpt: Path) -> None:
    add_dense()(ckpt)
    (ckpt / "2_Dense" / "model.safetensors").rename(ckpt / "2_Dense" / "pytorch_model.bin")


def pooling(**changes):
    return lambda ckpt: edit_json(ckpt / "1_Pooling" / "config.json", **changes)


def reorder_normalize_first(ckpt: Path) -> None:
    modules = json.loads((ckpt / "modules.json").read_text())
    (ckpt / "modules.json").write_text(json.dumps([modules[0], modules[2], modules[1]]))


# (case, change to all-MiniLM-L6-v2, fragments the one error line must hold)
CASES = [
    ("dense with a custom activation", add_dense(activation_function="my_package.Swish"),
     ["2_Dense", "the activation my_package.Swish"]),
    ("dense with a torch activation that takes arguments", add_dense(activation_function="torch.nn.Softmax"),
     ["the activation torch.nn.Softmax"]),
    ("dense with pickle weights", dense_with_pickle_weights, ["2_Dense", "not pickle .bin weights"]),
    ("dense over token embeddings", add_dense(module_input_name="token_embeddings"),
     ["a Dense from 'token_embeddings'"]),
    ("dense of the wrong size", add_dense(in_features=128), ["in_features 128", "384 dimensions"]),
    ("dense before pooling", add_dense(position=1), ["Transformer -> Dense -> Pooling -> Normalize"]),
    ("an unknown pooling mode", pooling(pooling_mode="median"), ["pooling mode 'median' is not one of"]),
    ("include_prompt false", pooling(include_prompt=False), ["include_prompt false"]),
    ("normalize before pooling", reorder_normalize_first, ["Transformer -> Normalize -> Pooling"]),
    # A classifier architecture is exported as a reranker: over an embedder's folder it is refused (its
    # sentence-transformers config and its weights say it is no cross-encoder).
    ("classifier architecture over an embedder",
     lambda c: edit_json(c / "config.json", architectures=["BertForSequenceClassification"]),
     ["BertForSequenceClassification", "CrossEncoder"]),
    ("question answering architecture",
     lambda c: edit_json(c / "config.json", architectures=["BertForQuestionAnswering"]),
     ["architecture BertForQuestionAnswering"]),
    ("albert model type", lambda c: edit_json(c / "config.json", model_type="albert"), ["model_type 'albert'"]),
    ("a cross-encoder pipeline", lambda c: edit_json(c / "config_sentence_transformers.json",
                                                     model_type="CrossEncoder"), ["model_type 'CrossEncoder'"]),
    ("a default prompt that is not one of the prompts",
     lambda c: edit_json(c / "config_sentence_transformers.json", prompts={"query": "query: "},
                         default_prompt_name="passage"), ["default_prompt_name 'passage' is not one of", "query"]),
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


# Refused once the export has the tokenizers to compare; the others where it reads the checkpoint, before it writes
# anything (model/checkpoint.py): the command's one line is that error's message, and one of them runs it too.
LATER = {"tokenizer_config disagrees with tokenizer.json", "left padding"}
BY_COMMAND = [c for c in CASES if c[0] in LATER or c is CASES[0]]


@pytest.mark.parametrize("change,fragments", [c[1:] for c in CASES if c[0] not in LATER],
                         ids=[c[0] for c in CASES if c[0] not in LATER])
def test_the_checkpoint_is_refused_in_one_line(minilm_copy, change, fragments):
    change(minilm_copy)
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(minilm_copy)
    message = str(refused.value)
    assert "\n" not in message and all(f in message for f in fragments), message


@pytest.mark.parametrize("change,fragments", [c[1:] for c in BY_COMMAND], ids=[c[0] for c in BY_COMMAND])
def test_export_refuses_in_one_line(minilm_copy, tmp_path, change, fragments):
    change(minilm_copy)
    out = tmp_path / "out"
    assert_one_line_error(run_cli("export", "--checkpoint", minilm_copy, "--out", out), *fragments)
    assert not out.exists() and not list(tmp_path.glob(".out.building-*"))


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory) -> Path:
    """A real BertForSequenceClassification, as transformers saves it: its classifier is the output."""
    return save_tiny_bert(tmp_path_factory.mktemp("cross") / "ckpt", model_class="BertForSequenceClassification")


def test_a_cross_encoder_is_exported_as_a_reranker_never_an_embedder(cross_encoder, tmp_path):
    from attnserve.engine.manifest import load_manifest

    result = run_cli("export", "--checkpoint", cross_encoder, "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    manifest = load_manifest(tmp_path / "out")
    # transformers' BertForSequenceClassification has two labels by default: no sigmoid, as CrossEncoder does.
    assert (manifest.kind, manifest.num_labels, manifest.score_activation) == ("reranker", 2, "identity")
    assert not any(name.startswith("embeddings") for name in manifest.variants)


def test_classifier_weights_are_refused_whatever_config_json_says(cross_encoder, tmp_path):
    """(A classifier with another head too is refused by tests/test_cross_encoder_families.py's EXTRA_KEY rows.)"""
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
