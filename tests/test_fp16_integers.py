"""The fp16 graph computes no integer from floats (issue 19).

MPNet's relative position buckets were computed in the graph by log() and a cast to an integer; the fp16 converter
ran that arithmetic in half precision, which moved distances 16, 32 and 64 to the next bucket, and the real
all-mpnet-base-v2 missed fp16 parity (cosine 0.985). The encoder now looks buckets up in a table computed once in
fp32, checked here against transformers' own bucketing; export refuses a graph that still casts a float to an
integer before converting it to fp16.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from attnserve.errors import ExportVerificationError
from attnserve.export.optimize import convert_fp16, float_to_integer_casts
from attnserve.export.torch_to_onnx import export_graph
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.encoder import SentenceEncoder
from attnserve.model.sentence_head import load_head

from .checkpoints import save_sentence_transformer, save_tiny_family


def test_relative_position_buckets_are_transformers_at_every_length():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    from attnserve.model.encoder import Encoder, EncoderConfig

    # all-mpnet-base-v2's sizes where they matter: 514 positions (512 usable), 32 buckets.
    cfg = EncoderConfig(hidden_size=24, num_heads=2, num_layers=1, intermediate_size=48, family="mpnet",
                        max_position_embeddings=514, pad_token_id=1, positions_after_padding=True,
                        relative_attention_buckets=32, type_vocab_size=0)
    encoder = Encoder(cfg)
    positions = torch.arange(cfg.usable_positions)  # (T,)
    # The encoder's lookup, as forward() makes it: query - key, offset into the table.
    ours = encoder.relative_buckets[positions[:, None] - positions[None, :] + cfg.max_position_embeddings - 1]
    # transformers: relative_position = key - query (memory - context).
    theirs = MPNetEncoder.relative_position_bucket(positions[None, :] - positions[:, None], num_buckets=32)
    assert ours.shape == (512, 512)
    assert torch.equal(ours, theirs)


def _float_math_to_index(path):
    """A graph that computes an index from floats: floor(log(x) * 4) as int64."""
    nodes = [helper.make_node("Log", ["x"], ["log"]),
             helper.make_node("Mul", ["log", "four"], ["scaled"]),
             helper.make_node("Cast", ["scaled"], ["index"], to=TensorProto.INT64, name="to_index")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("index", TensorProto.INT64, [3])],
                              [helper.make_tensor("four", TensorProto.FLOAT, [], [4.0])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.fixture(scope="module")
def mpnet(tmp_path_factory):
    """A tiny random-weight MPNet, saved as a sentence-transformers pipeline."""
    root = tmp_path_factory.mktemp("mpnet")
    return read_checkpoint(save_sentence_transformer(save_tiny_family(root / "model", "mpnet"), root / "st", "mean"))


def test_fp16_conversion_refuses_float_arithmetic_that_decides_integers(mpnet, tmp_path):
    _float_math_to_index(tmp_path / "index.onnx")
    assert float_to_integer_casts(onnx.load(str(tmp_path / "index.onnx"))) == ["to_index"]
    with pytest.raises(ExportVerificationError, match="to_index"):
        convert_fp16(tmp_path / "index.onnx", tmp_path / "index_fp16.onnx", mpnet.config)


def test_mpnet_graph_finds_buckets_by_integers_alone(mpnet, tmp_path):
    ckpt = mpnet
    export_graph(SentenceEncoder(load_encoder(ckpt), load_head(ckpt.directory, ckpt.pipeline)),
                 tmp_path / "embeddings.onnx")
    model = onnx.load(str(tmp_path / "embeddings.onnx"))
    assert float_to_integer_casts(model) == []
    assert not {"Log", "Floor"} & {node.op_type for node in model.graph.node}
    # The fp16 graph it gives agrees with PyTorch at a length with distances 16 and 32 (fp16's tolerance).
    convert_fp16(tmp_path / "embeddings.onnx", tmp_path / "fp16.onnx", ckpt.config)
    import onnxruntime as ort

    ids = np.random.default_rng(0).integers(5, ckpt.config.vocab_size, size=(2, 40))  # (B, T)
    mask = np.ones_like(ids)
    got = ort.InferenceSession(str(tmp_path / "fp16.onnx"), providers=["CPUExecutionProvider"]).run(
        ["sentence_embedding"], {"input_ids": ids, "attention_mask": mask})[0]  # (B, D)
    encoder, head = load_encoder(ckpt), load_head(ckpt.directory, ckpt.pipeline)
    with torch.no_grad():
        m = torch.from_numpy(mask)
        expected = head(encoder(torch.from_numpy(ids), m)[0], m).numpy()  # (B, D)
    cosine = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= 0.999, cosine
