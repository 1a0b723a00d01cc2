"""The artifact directory: manifest, fused and quantised graphs, dynamic shapes, and verification failures."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from attnserve.engine.batching import pad
from attnserve.engine.session import CPU, open_session
from attnserve.errors import ExportVerificationError
from attnserve.export.int8_recipes import weight_type
from attnserve.export.optimize import FIRST_FFN_DOWN, op_counts
from attnserve.export.verify import TOLERANCES, Reference, shape_grid, verify
from attnserve.model.pooling import pool


def test_manifest_records_model_variants_and_parity(artifacts):
    manifest = json.loads((artifacts / "manifest.json").read_text())
    assert manifest["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert (manifest["hidden_size"], manifest["num_layers"], manifest["num_heads"]) == (384, 6, 12)
    assert manifest["intermediate_size"] == 1536
    assert (manifest["vocab_size"], manifest["max_seq_length"], manifest["pooling"]) == (30522, 256, "mean")
    assert set(manifest["variants"]) == {"embeddings", "embeddings_fused", "embeddings_int8",
                                         "embeddings_int8_skip_layer_norm", "embeddings_fp16", "attention",
                                         "attention_last"}
    for name, variant in manifest["variants"].items():
        assert (artifacts / variant["file"]).is_file() and len(variant["sha256"]) == 64
        tolerance = TOLERANCES[variant["precision"]]
        assert tolerance.holds(variant["parity"][tolerance.metric]), name
    assert manifest["variants"]["attention"]["parity"]["max_padded_key_weight"] == 0.0
    last = manifest["variants"]["attention_last"]
    assert last["outputs"] == ["last_hidden_state", "sentence_embedding", "last_attentions", "rollout"]
    assert last["parity"]["max_padded_key_weight"] == 0.0 and last["parity"]["max_abs_rollout"] <= 1e-4
    assert {"torch", "onnx", "onnxruntime", "tokenizers"} <= set(manifest["tools"])


def feed(session, ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """MiniLM has token types: zeros, as today (artifacts exported before the graphs took them have none)."""
    types = {"token_type_ids": np.zeros_like(ids)} if "token_type_ids" in [i.name for i in session.get_inputs()] else {}
    return {"input_ids": ids, "attention_mask": mask, **types}


def test_the_fused_int8_and_fp16_graphs_are_what_they_claim(artifacts):
    counts = op_counts(onnx.load(str(artifacts / "embeddings_fused.onnx"), load_external_data=False))
    assert counts.get("Attention") == 6  # one attention node per layer
    plain = op_counts(onnx.load(str(artifacts / "embeddings.onnx"), load_external_data=False))
    assert "Attention" not in plain and plain.get("Softmax") == 6
    int8 = onnx.load(str(artifacts / "embeddings_int8.onnx"))
    ops = op_counts(int8)
    assert "QAttention" in ops or "DynamicQuantizeMatMul" in ops or "MatMulInteger" in ops
    # The integer ops' weights: s8, or u8 where this CPU's u8s8 kernels saturate (export/int8_recipes.weight_type).
    types = {init.name: init.data_type for init in int8.graph.initializer}
    quantized = {types.get(n.input[1]) for n in int8.graph.node
                 if n.op_type in ("QAttention", "DynamicQuantizeMatMul", "MatMulInteger")}
    assert quantized == {getattr(onnx.TensorProto, "UINT8" if weight_type() == "QUInt8" else "INT8")}, quantized
    # MiniLM's first feed-forwards carry outlier units (export/int8_outliers.py): those are computed apart, by
    # fp32 MatMuls on fp32 weights, and the down-projections themselves are int8 (no fp32 MatMul of that name).
    weights = {init.name: init.data_type for init in int8.graph.initializer}
    side = [n for n in int8.graph.node if n.op_type == "MatMul" and "/outliers/" in n.name]
    assert any(n.name.startswith(FIRST_FFN_DOWN.rsplit("/", 1)[0]) for n in side)
    assert all(weights[n.input[1]] == onnx.TensorProto.FLOAT for n in side)
    assert not [n for n in int8.graph.node if n.name == FIRST_FFN_DOWN and n.op_type == "MatMul"]
    assert ops.get("FastGelu") == 6 + len(side) // 2 and "BiasGelu" not in ops  # tanh GELU: int8's recipe
    fp16 = onnx.load(str(artifacts / "embeddings_fp16.onnx"))
    assert onnx.TensorProto.FLOAT16 in {init.data_type for init in fp16.graph.initializer}
    # Inputs and outputs keep their declared types: int64 in, fp32 out.
    assert [o.type.tensor_type.elem_type for o in fp16.graph.output] == [onnx.TensorProto.FLOAT] * 2


@pytest.mark.parametrize("variant", ["embeddings.onnx", "embeddings_fused.onnx", "attention.onnx",
                                     "attention_last.onnx"])
def test_graphs_run_at_shapes_never_used_in_export(artifacts, encoder, variant):
    session = open_session(artifacts / variant, CPU)
    used = set(shape_grid(256)) | {(2, 8)}  # the verification grid and the tracing shape
    rng = np.random.default_rng(7)
    for batch, seq in [(23, 97), (3, 255), (31, 5), (1, 200)]:
        assert (batch, seq) not in used
        lengths = rng.integers(1, seq + 1, size=batch)
        lengths[0] = seq
        ids, mask = pad([rng.integers(1000, 30522, size=n) for n in lengths])
        outputs = session.run(None, feed(session, ids, mask))
        with torch.no_grad():
            hidden, _ = encoder(torch.from_numpy(ids), torch.from_numpy(mask))
            sentence = pool(hidden, torch.from_numpy(mask), "mean").numpy()
        real = mask.astype(bool)
        assert outputs[0].shape == (batch, seq, 384) and outputs[1].shape == (batch, 384)
        assert np.abs(outputs[0] - hidden.numpy())[real].max() <= 1e-4
        assert np.abs(outputs[1] - sentence).max() <= 1e-4
        if variant == "attention.onnx":
            assert outputs[2].shape == (6, batch, 12, seq, seq)
        if variant == "attention_last.onnx":
            assert outputs[2].shape == (batch, 12, seq, seq) and outputs[3].shape == (batch, seq, seq)


def test_the_last_layer_graph_gives_the_attention_graphs_last_layer_and_its_rollout(artifacts):
    """export/attention_last.py: the last layer's maps as the attention graph gives them, and each row's rollout as
    the server computes it from every layer's maps, over padded rows of mixed lengths; the other layers' maps are
    never stacked and no value norm is computed."""
    from attnserve.attention_analyses import rollout

    ops = op_counts(onnx.load(str(artifacts / "attention_last.onnx"), load_external_data=False))
    assert "ReduceL2" not in ops and "Identity" not in ops  # no value norms; outputs written where they are made
    attention = open_session(artifacts / "attention.onnx", CPU, arena=False)
    last = open_session(artifacts / "attention_last.onnx", CPU, arena=False)
    rng = np.random.default_rng(3)
    lengths = [40, 1, 17, 33, 2]
    ids, mask = pad([rng.integers(1000, 30522, size=n) for n in lengths])
    maps = attention.run(["attentions"], feed(attention, ids, mask))[0]  # (L, B, nh, T, T)
    got_maps, got_rollout = last.run(["last_attentions", "rollout"], feed(last, ids, mask))  # (B,nh,T,T), (B,T,T)
    for row, n in enumerate(lengths):
        np.testing.assert_allclose(got_maps[row, :, :n, :n], maps[-1, row, :, :n, :n], atol=1e-6)
        assert not got_maps[row, :, :, n:].any()  # padded keys: weight 0
        want = rollout(maps[:, row, :, :n, :n])  # (n, n)
        np.testing.assert_allclose(got_rollout[row, :n, :n], want, atol=1e-5)
        np.testing.assert_allclose(got_rollout[row, :n, :n].sum(axis=1), 1.0, atol=1e-5)


def test_verification_fails_with_a_clear_message(artifacts, encoder, checkpoint):
    from attnserve.engine.tokenizer import TextTokenizer
    from attnserve.model.sentence_head import load_head

    tokenizer = TextTokenizer(artifacts / "tokenizer.json", 256, 30522)
    # Artifacts exported before the graphs took token_type_ids (ATTNSERVE_TEST_ARTIFACTS) are checked without them.
    int8 = open_session(artifacts / "embeddings_int8.onnx", CPU)
    takes_types = "token_type_ids" in [i.name for i in int8.get_inputs()]
    reference = Reference(encoder, load_head(checkpoint.directory, checkpoint.pipeline), checkpoint.embedding_size,
                          tokenizer, n_texts=32, token_types=takes_types)
    # The int8 graph is close, but nowhere near fp32's 1e-4: held to fp32's tolerance it must fail.
    with pytest.raises(ExportVerificationError, match=r"embeddings_int8.onnx \(fp32\) fails parity.*<= 0.0001"):
        verify(artifacts / "embeddings_int8.onnx", "fp32", reference)
