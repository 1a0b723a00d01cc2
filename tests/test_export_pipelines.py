"""Pipelines the export does reproduce, checked end to end against sentence-transformers itself.

Tiny random-weight BERTs (2 layers, hidden 32) with vocabularies of 64 and exactly 1,000 tokens,
saved as sentence-transformers pipelines by sentence-transformers: each is exported, verified,
and its artifacts encode texts to what sentence-transformers' own `encode` gives.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from attnserve.engine.engine import Engine
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import read_checkpoint

from .checkpoints import copy_checkpoint, edit_json, save_pipeline, save_sentence_transformer, save_tiny_bert
from .conftest import run_cli

# Upper case, punctuation, pieces outside the tiny vocabularies, and texts past max_seq_length.
TEXTS = ["hello world", "A LONGER sentence, with punctuation!", "café über naïve 42", "x",
         "the quick brown fox jumps over the lazy dog " * 12]


def encodes_as_sentence_transformers(artifacts: Path, checkpoint: Path):
    from sentence_transformers import SentenceTransformer

    encoded = Engine.from_directory(artifacts).encode(TEXTS)
    assert np.abs(encoded.embeddings - SentenceTransformer(str(checkpoint), device="cpu").encode(TEXTS)).max() <= 1e-5
    return encoded


def test_vocabulary_of_64_exports_verifies_and_encodes_as_sentence_transformers(tmp_path):
    # Saved by sentence-transformers 6: max_seq_length (48) lives in tokenizer_config.json, not in
    # sentence_bert_config.json, and is below the model's 64 positions.
    model = save_tiny_bert(tmp_path / "bert", vocab_size=64)
    checkpoint = save_sentence_transformer(model, tmp_path / "st", "mean", normalize=True, max_seq_length=48)
    out = tmp_path / "artifacts"
    result = run_cli("export", "--all", "--checkpoint", checkpoint, "--out", out)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["vocab_size"], manifest["max_seq_length"]) == (64, 48)
    assert (manifest["pooling"], manifest["normalize"]) == ("mean", True)
    assert "verified embeddings_int8.onnx" in result.stderr and "verified attention.onnx" in result.stderr

    assert encodes_as_sentence_transformers(out, checkpoint).truncated.tolist() == [False] * 4 + [True]


def test_vocabulary_of_1000_masked_lm_with_cls_pooling_encodes_as_sentence_transformers(tmp_path):
    # Exactly 1,000 ids: the made-up trace and check inputs used to start at id 1000. A masked-LM
    # checkpoint carries its unused head (cls.predictions.*) and "bert."-prefixed keys.
    model = save_tiny_bert(tmp_path / "bert", vocab_size=1000, model_class="BertForMaskedLM")
    checkpoint = save_sentence_transformer(model, tmp_path / "st", "cls", normalize=False, max_seq_length=40)
    ckpt = read_checkpoint(checkpoint)
    assert (ckpt.pooling, ckpt.normalize, ckpt.max_seq_length) == ("cls", False, 40)
    build_artifacts(ckpt, tmp_path / "artifacts", log=lambda m: None, variants=["embeddings"])  # what it reads
    encodes_as_sentence_transformers(tmp_path / "artifacts", checkpoint)


def test_every_dense_activation_with_and_without_bias_encodes_as_sentence_transformers(tmp_path):
    # One Dense per activation the export writes, in a chain after two concatenated poolings (2 x 32 -> 64).
    import torch
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling

    from attnserve.model.dense import DENSE_ACTIVATIONS

    model = save_tiny_bert(tmp_path / "bert", vocab_size=64)
    torch.manual_seed(0)
    dense = [Dense(64 if i == 0 else 48, 48, bias=i % 2 == 1, activation_function=getattr(torch.nn, name)())
             for i, name in enumerate(DENSE_ACTIVATIONS)]
    checkpoint = save_pipeline(model, tmp_path / "st", lambda size: [Pooling(size, ["max", "lasttoken"]), *dense],
                               max_seq_length=48)
    ckpt = read_checkpoint(checkpoint)
    assert [m.split(",")[1].strip(" )") for m in ckpt.modules[2:]] == [a.lower() for a in DENSE_ACTIVATIONS]
    build_artifacts(ckpt, tmp_path / "artifacts", log=lambda m: None, variants=["embeddings"])  # what it reads
    assert encodes_as_sentence_transformers(tmp_path / "artifacts", checkpoint).embeddings.shape == (len(TEXTS), 48)


def test_a_bare_transformers_save_reads_as_sentence_transformers_loads_it(tmp_path):
    # No modules.json: sentence-transformers builds Transformer + mean pooling, no normalisation,
    # truncating at the tokenizer's length capped at the model's positions.
    ckpt = read_checkpoint(save_tiny_bert(tmp_path / "bert", vocab_size=64))
    assert (ckpt.pooling, ckpt.normalize, ckpt.max_seq_length, ckpt.max_seq_length_from) == ("mean", False, 64,
                                                                                          "tokenizer")


@pytest.mark.parametrize("file,changes", [
    ("config_sentence_transformers.json", {"prompts": {"query": "query: ", "document": ""},
                                           "similarity_fn_name": "dot"}),
    ("config_sentence_transformers.json", {"prompts": {"query": ""}, "default_prompt_name": "query"}),
    ("sentence_bert_config.json", {"unpad_inputs": False, "transformer_task": "feature-extraction"}),
    ("1_Pooling/config.json", {"pooling_mode": ["mean"], "include_prompt": True}),
], ids=["named prompts", "empty default prompt", "settings that change nothing", "one mode in a list"])
def test_settings_that_leave_the_output_alone_are_accepted(checkpoint, tmp_path, file, changes):
    copy = copy_checkpoint(checkpoint.directory, tmp_path / "ckpt")
    edit_json(copy / file, **changes)
    ckpt = read_checkpoint(copy)
    assert (ckpt.pooling, ckpt.normalize, ckpt.max_seq_length) == ("mean", True, 256)
