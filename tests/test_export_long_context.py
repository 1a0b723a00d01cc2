"""Long-context models (and rerankers alike): verification and attention maps stop at the lengths memory allows (past
them one row's attention scores would not fit: Qwen3 at 32,768 tokens needs 68 GB a layer), the manifest says them,
attention past the cap is refused in one line on gRPC and HTTP, and embeddings are served up to the verified length.
A tiny ModernBERT with 8,192 positions stands for ModernBERT-base, the memory budgets (export/verify.py) scaled down
with it to the caps a real long-context model meets at its own size.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from attnserve.client import Client
from attnserve.client.client import RequestError
from attnserve.engine.manifest import Manifest, load_manifest
from attnserve.export import reranker, verify
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import read_checkpoint

from .checkpoints import save_sentence_transformer, save_tiny_modernbert
from .serving import ServerProcess, serving

POSITIONS = 8192
# The tiny model has 4 layers of 4 heads: maps of 1 MiB a row cap attention at 128 tokens; scores of 2 MiB a run
# (one row: 4 heads x T^2 x 4 bytes x 3 copies) cap verification at 209, the full-length cases run row by row.
ATTENTION_MAP_BYTES, SCORES_BYTES = 1 * 2**20, 2 * 2**20
VERIFIED, ATTENTION = 209, 128
# What the export may add to the process's memory: far from one row's maps at 8,192 (4 GiB), which an uncapped
# verification would hold. Measured as the growth while it runs (rss_growth), not the worker's lifetime peak
# (getrusage's ru_maxrss), which other files' tests in the same xdist worker set.
MOST_GROWTH = 2 * 2**30


@contextlib.contextmanager
def rss_growth() -> Iterator[list[int]]:
    """growth[0], once the block has run: the most this process's RSS (sampled from /proc every 5 ms) grew in it."""
    def rss() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    start, stop, growth = rss(), threading.Event(), [0]

    def sample() -> None:
        while not stop.wait(0.005):
            growth[0] = max(growth[0], rss() - start)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield growth
    finally:
        stop.set()
        sampler.join()
        growth[0] = max(growth[0], rss() - start)


def capped_build(checkpoint: Path, name: str, out: Path, variants: list[str]) -> tuple[Manifest, int]:
    """build_artifacts under the scaled-down budgets: (its manifest, how much it grew the process's memory)."""
    with pytest.MonkeyPatch.context() as patch, rss_growth() as growth:
        patch.setattr(verify, "ATTENTION_MAP_BYTES", ATTENTION_MAP_BYTES)
        patch.setattr(verify, "SCORES_BYTES", SCORES_BYTES)
        # A reranker's text pairs, run row by row under these budgets, are checked on 16 instead of 256 (the caps
        # are what this file tests; every other reranker's export checks them all).
        patch.setattr(reranker, "TEXT_PAIRS", 16)
        manifest = build_artifacts(read_checkpoint(checkpoint, name), out, log=lambda m: None, variants=variants)
    return manifest, growth[0]


def assert_shapes_checked(manifest: Manifest, full: str) -> None:
    """`full` ran the grid up to VERIFIED, the attention graph its cases up to ATTENTION (and its own case)."""
    shapes, past = manifest.variants, sum(1 for _, seq in verify.shape_grid(VERIFIED) if seq > ATTENTION)
    assert past >= 1 and shapes[full].parity["shapes_checked"] == len(verify.shape_grid(VERIFIED)) + 1
    assert shapes["attention"].parity["shapes_checked"] == shapes[full].parity["shapes_checked"] - past


@pytest.fixture(scope="module")
def long_context(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("long")
    model = save_tiny_modernbert(root / "model", max_position_embeddings=POSITIONS)
    checkpoint = save_sentence_transformer(model, root / "st", "mean", normalize=True)
    # The graphs the caps bound and the server runs; the others are verified by the same code over the same grid
    # (tests/test_weights_once.py and the families' tests build them all).
    _, growth = capped_build(checkpoint, "tiny-long", root / "artifacts", ["embeddings", "attention", "attention_last"])
    (root / "export_rss_growth").write_text(str(growth))
    return root / "artifacts"


def test_the_manifest_says_the_caps_and_export_stays_small(long_context):
    manifest = json.loads((long_context / "manifest.json").read_text())
    assert manifest["max_seq_length"] == POSITIONS
    assert (manifest["verified_max_length"], manifest["attention_max_length"]) == (VERIFIED, ATTENTION)
    assert manifest["variants"]["embeddings"]["parity"]["max_abs_last_hidden_state"] <= 1e-4
    assert_shapes_checked(load_manifest(long_context), "embeddings")
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
    manifest, growth = capped_build(checkpoint, "tiny-long-reranker", tmp_path / "artifacts", ["scores", "attention"])
    assert (manifest.kind, manifest.verified_max_length, manifest.attention_max_length) == (
        "reranker", VERIFIED, ATTENTION)
    assert_shapes_checked(manifest, "scores")
    assert growth < MOST_GROWTH
    pairs = [("what do cats eat", " ".join(["cats eat meat"] * 700)), ("a", "b"),
             ("what do cats eat", " ".join(["cats eat meat"] * 10))]  # past VERIFIED tokens, 4 and about 40
    engine = Engine.from_directory(tmp_path / "artifacts")
    inputs = engine.tokenizer.encode_pairs(pairs)
    assert [len(x) for x in inputs][0] == VERIFIED and inputs[0].truncated and not inputs[2].truncated
    cross_encoder = CrossEncoder(str(checkpoint), device="cpu", max_length=VERIFIED)
    want = cross_encoder.predict(pairs, activation_fn=torch.nn.Identity())
    assert abs(engine.score_tokenized(inputs)[:, 0] - want).max() <= 1e-4
