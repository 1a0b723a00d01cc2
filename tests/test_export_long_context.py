"""Long-context models: verification and attention maps stop at the lengths memory allows, the manifest says
them, and an attention request past the cap is refused in one line on gRPC and HTTP while embeddings are served
up to the verified length (past it, one row's attention scores would not fit: Qwen3 at 32,768 tokens needs 68 GB a
layer), longer inputs truncated or refused as past max_seq_length. Rerankers (bge-reranker-v2-m3 at 8,192 tokens,
Qwen3-Reranker at 32,768) are capped alike.

A tiny ModernBERT with 8,192 positions stands for ModernBERT-base: its maps are small, so the memory budgets
(export/verify.py) are scaled down with it, to the caps a real long-context model meets at its own size.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from attnserve.client import Client
from attnserve.client.client import RequestError
from attnserve.export import verify
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import read_checkpoint

from .checkpoints import save_sentence_transformer, save_tiny_modernbert
from .memory_peak import rss_growth
from .serving import ServerProcess, serving

POSITIONS = 8192
# The tiny model has 4 layers of 4 heads: maps of 1 MiB a row cap attention at 128 tokens; scores of 2 MiB a run
# (one row: 4 heads x T^2 x 4 bytes x 3 copies) cap verification at 209, the full-length cases run row by row.
ATTENTION_MAP_BYTES, SCORES_BYTES = 1 * 2**20, 2 * 2**20
VERIFIED, ATTENTION = 209, 128
# What the export may add to the process's memory: far from one row's maps at 8,192 (4 GiB), which an uncapped
# verification would hold. Measured as the growth while it runs (tests/memory_peak.py), not the worker's lifetime
# peak, which other files' tests in the same xdist worker set.
MOST_GROWTH = 2 * 2**30


@pytest.fixture(scope="module")
def long_context(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("long")
    model = save_tiny_modernbert(root / "model", max_position_embeddings=POSITIONS)
    checkpoint = save_sentence_transformer(model, root / "st", "mean", normalize=True)
    with pytest.MonkeyPatch.context() as patch, rss_growth() as growth:
        patch.setattr(verify, "ATTENTION_MAP_BYTES", ATTENTION_MAP_BYTES)
        patch.setattr(verify, "SCORES_BYTES", SCORES_BYTES)
        # The graphs whose verification the caps bound, and what the server runs: the fp32 graph and the maps'
        # The other variants are verified by the same code over the same grid (tests/test_weights_once.py and
        # the families' tests build them all).
        build_artifacts(read_checkpoint(checkpoint, "tiny-long"), root / "artifacts", log=lambda m: None,
                        variants=["embeddings", "attention", "attention_last"])
    (root / "export_rss_growth").write_text(str(growth.bytes))
    return root / "artifacts"


def test_the_manifest_says_the_caps_and_export_stays_small(long_context):
    manifest = json.loads((long_context / "manifest.json").read_text())
    assert manifest["max_seq_length"] == POSITIONS
    assert (manifest["verified_max_length"], manifest["attention_max_length"]) == (VERIFIED, ATTENTION)
    assert manifest["variants"]["embeddings"]["parity"]["max_abs_last_hidden_state"] <= 1e-4
    # The attention graph ran the cases up to ATTENTION only: those at VERIFIED left out (its own case at ATTENTION
    # is in the grid of every graph).
    shapes = {name: v["parity"]["shapes_checked"] for name, v in manifest["variants"].items()}
    past = sum(1 for _, seq in verify.shape_grid(VERIFIED) if seq > ATTENTION)
    assert past >= 1 and shapes["embeddings"] == len(verify.shape_grid(VERIFIED)) + 1
    assert shapes["attention"] == shapes["embeddings"] - past
    # Bounded memory: nothing near what verifying at 8,192 would take (one row's maps: 4 GiB).
    assert int((long_context.parent / "export_rss_growth").read_text()) < MOST_GROWTH


def test_attention_past_the_cap_is_refused_in_one_line_on_every_door(long_context, tmp_path):
    within, past = " ".join(["a"] * 100), " ".join(["a"] * 150)  # 102 and 152 tokens with [CLS] and [SEP]
    with serving(ServerProcess(long_context, log_path=tmp_path / "server.log")) as server:
        ok = httpx.post(f"{server.http_url}/v1/attention", json={"inputs": within}, timeout=60)
        refused = httpx.post(f"{server.http_url}/v1/attention", json={"inputs": past}, timeout=60)
        embedded = httpx.post(f"{server.http_url}/v1/embeddings", json={"input": " ".join(["a"] * 200),
                                                                        "model": "tiny-long"}, timeout=60)
        cut = httpx.post(f"{server.http_url}/v1/embeddings", json={"input": " ".join(["a"] * 3000),
                                                                   "model": "tiny-long"}, timeout=60)
        too_long = httpx.post(f"{server.http_url}/v1/embeddings", json={
            "input": " ".join(["a"] * 3000), "model": "tiny-long", "truncate": False}, timeout=60)
        info = httpx.get(f"{server.http_url}/info", timeout=60).json()
        with Client(server.target) as client:
            client.attention(within)
            with pytest.raises(RequestError) as error:
                client.attention(past)
    assert ok.status_code == 200, ok.text
    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]["message"]
    assert f"attention_max_length {ATTENTION}" in message and "\n" not in message, message
    assert "truncate" not in message, message  # truncation cuts at max_seq_length: no help here
    assert error.value.code.name == "INVALID_ARGUMENT"
    assert error.value.error_details.reason == "INVALID_INPUT"
    assert f"attention_max_length {ATTENTION}" in error.value.details and "\n" not in error.value.details
    assert embedded.status_code == 200, embedded.text
    assert embedded.json()["usage"]["prompt_tokens"] == 202  # embeddings go past the attention cap
    # ... up to the verified length: longer inputs are cut there (the server's default) or refused, saying why.
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == VERIFIED, cut.text
    assert too_long.status_code in (400, 413), too_long.text
    message = too_long.json()["error"]["message"]
    assert f"max_seq_length {VERIFIED}" in message and f"{POSITIONS} positions" in message, message
    assert "\n" not in message, message
    assert info["max_input_length"] == VERIFIED


def test_a_long_context_reranker_is_verified_and_served_up_to_the_caps(tmp_path):
    """A cross-encoder's verification stops at the same caps (export/reranker.py PairReference); its pairs are
    served up to the verified length, cut there as CrossEncoder cuts them at that max_length."""
    import torch
    from sentence_transformers import CrossEncoder

    from attnserve.engine.engine import Engine

    from .tiny_cross_encoders import save_tiny_cross_encoder

    checkpoint = save_tiny_cross_encoder(tmp_path / "ce", "modernbert-mean", max_position_embeddings=POSITIONS)
    with pytest.MonkeyPatch.context() as patch, rss_growth() as growth:
        patch.setattr(verify, "ATTENTION_MAP_BYTES", ATTENTION_MAP_BYTES)
        patch.setattr(verify, "SCORES_BYTES", SCORES_BYTES)
        manifest = build_artifacts(read_checkpoint(checkpoint, "tiny-long-reranker"), tmp_path / "artifacts",
                                   log=lambda m: None, variants=["scores", "attention"])
    assert (manifest.kind, manifest.verified_max_length, manifest.attention_max_length) == (
        "reranker", VERIFIED, ATTENTION)
    shapes = {name: v.parity["shapes_checked"] for name, v in manifest.variants.items()}
    past = sum(1 for _, seq in verify.shape_grid(VERIFIED) if seq > ATTENTION)
    assert shapes["scores"] == len(verify.shape_grid(VERIFIED)) + 1 and shapes["attention"] == shapes["scores"] - past
    assert growth.bytes < MOST_GROWTH
    pairs = [("what do cats eat", " ".join(["cats eat meat"] * 700)), ("a", "b"),
             ("what do cats eat", " ".join(["cats eat meat"] * 10))]  # past VERIFIED tokens, 4 and about 40
    engine = Engine.from_directory(tmp_path / "artifacts")
    inputs = engine.tokenizer.encode_pairs(pairs)
    assert [len(x) for x in inputs][0] == VERIFIED and inputs[0].truncated and not inputs[2].truncated
    cross_encoder = CrossEncoder(str(checkpoint), device="cpu", max_length=VERIFIED)
    want = cross_encoder.predict(pairs, activation_fn=torch.nn.Identity())
    assert abs(engine.score_tokenized(inputs)[:, 0] - want).max() <= 1e-4
