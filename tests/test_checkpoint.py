"""Checkpoint loading fails loudly, naming the file and the problem."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

from attnserve.errors import CheckpointError
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.families import key_map

from .conftest import assert_one_line_error, run_cli


@pytest.fixture
def checkpoint_copy(checkpoint, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(checkpoint.directory, dst)
    return dst


def test_key_map_covers_every_parameter(encoder, checkpoint):
    assert sorted(key_map(checkpoint.config).values()) == sorted(encoder.state_dict())


def test_pickle_weights_are_refused(checkpoint_copy):
    (checkpoint_copy / "model.safetensors").rename(checkpoint_copy / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="only model.safetensors"):
        read_checkpoint(checkpoint_copy)


def test_missing_and_unexpected_keys(checkpoint_copy):
    tensors = load_file(checkpoint_copy / "model.safetensors")
    tensors["encoder.layer.9.extra.weight"] = tensors.pop("encoder.layer.3.output.dense.weight")
    save_file(tensors, checkpoint_copy / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        load_encoder(read_checkpoint(checkpoint_copy))
    assert "encoder.layer.3.output.dense.weight" in str(e.value) and "encoder.layer.9.extra.weight" in str(e.value)


def test_prefixed_task_checkpoint_loads(checkpoint_copy, encoder):
    # BertForX checkpoints prefix keys with "bert." and add a head; the encoder part must still load.
    tensors = {f"bert.{k}": v for k, v in load_file(checkpoint_copy / "model.safetensors").items()}
    save_file(tensors, checkpoint_copy / "model.safetensors")
    loaded = load_encoder(read_checkpoint(checkpoint_copy))
    assert all((a == b).all() for a, b in zip(loaded.state_dict().values(), encoder.state_dict().values(), strict=True))


# An unknown model_type: tests/test_export_refusals.py.
def test_cli_export_of_a_missing_checkpoint_is_one_line(tmp_path):
    assert_one_line_error(run_cli("export", "--checkpoint", tmp_path / "missing", "--out", tmp_path / "a"),
                          "checkpoint directory not found")


def test_cli_export_of_a_corrupt_checkpoint_is_one_line(checkpoint_copy, tmp_path):
    """Found as the weights load (model/checkpoint.py load_encoder), after the checkpoint's files read well."""
    (checkpoint_copy / "model.safetensors").write_bytes(b"not safetensors at all")
    result = run_cli("export", "--checkpoint", checkpoint_copy, "--out", tmp_path / "a")
    assert_one_line_error(result, "corrupt weights")
    assert not (tmp_path / "a").exists()


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
    from .checkpoints import copy_checkpoint, edit_json

    copy = copy_checkpoint(checkpoint.directory, tmp_path / "ckpt")
    edit_json(copy / file, **{key: value})
    if file == "tokenizer_config.json":  # read only when sentence_bert_config.json sets no length
        edit_json(copy / "sentence_bert_config.json", max_seq_length=None)
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(copy)
    assert file.split("/")[-1] in str(e.value) and "\n" not in str(e.value)
