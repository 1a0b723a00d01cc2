"""Long-context models: verification and attention maps stop at the lengths memory allows, the manifest says
them, and an attention request past the cap is refused in one line on gRPC and HTTP while embeddings are served
at the full length.

A tiny ModernBERT with 8,192 positions stands for ModernBERT-base: its maps are small, so the memory budgets
(export/verify.py) are scaled down with it, to the caps a real long-context model meets at its own size.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path

import httpx
import pytest

from attnserve.client import Client
from attnserve.client.client import RequestError
from attnserve.export import verify
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import read_checkpoint

from .checkpoints import save_sentence_transformer, save_tiny_modernbert
from .serving import ServerProcess, serving

POSITIONS = 8192
# The tiny model has 4 layers of 4 heads: maps of 4 MiB a row cap attention at 256 tokens; scores of 8 MiB a run
# (one row: 4 heads x T^2 x 4 bytes x 3 copies) cap verification at 418, the full-length cases run row by row.
ATTENTION_MAP_BYTES, SCORES_BYTES = 4 * 2**20, 8 * 2**20


@pytest.fixture(scope="module")
def long_context(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("long")
    model = save_tiny_modernbert(root / "model", max_position_embeddings=POSITIONS)
    checkpoint = save_sentence_transformer(model, root / "st", "mean", normalize=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(verify, "ATTENTION_MAP_BYTES", ATTENTION_MAP_BYTES)
        patch.setattr(verify, "SCORES_BYTES", SCORES_BYTES)
        build_artifacts(read_checkpoint(checkpoint, "tiny-long"), root / "artifacts", log=lambda m: None)
    return root / "artifacts"


def test_the_manifest_says_the_caps_and_export_stays_small(long_context):
    manifest = json.loads((long_context / "manifest.json").read_text())
    assert manifest["max_seq_length"] == POSITIONS
    assert (manifest["verified_max_length"], manifest["attention_max_length"]) == (418, 256)
    assert manifest["variants"]["embeddings"]["parity"]["max_abs_last_hidden_state"] <= 1e-4
    # The attention graph ran the cases up to 256 only: the two at 418 left out (its own case at 256 is in the
    # grid of every graph).
    shapes = {name: v["parity"]["shapes_checked"] for name, v in manifest["variants"].items()}
    assert shapes["embeddings"] == len(verify.shape_grid(418)) + 1 and shapes["attention"] == shapes["embeddings"] - 2
    # Bounded memory: nothing near what verifying at 8,192 would take (one row's maps: 4 GiB).
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 < 4 * 2**30


def test_attention_past_the_cap_is_refused_in_one_line_on_every_door(long_context, tmp_path):
    within, past = " ".join(["a"] * 200), " ".join(["a"] * 300)  # 202 and 302 tokens with [CLS] and [SEP]
    with serving(ServerProcess(long_context, "--max-batch-tokens", str(POSITIONS),
                               log_path=tmp_path / "server.log")) as server:
        ok = httpx.post(f"{server.http_url}/v1/attention", json={"inputs": within}, timeout=60)
        refused = httpx.post(f"{server.http_url}/v1/attention", json={"inputs": past}, timeout=60)
        embedded = httpx.post(f"{server.http_url}/v1/embeddings", json={"input": " ".join(["a"] * 3000),
                                                                        "model": "tiny-long"}, timeout=60)
        with Client(server.target) as client:
            client.attention(within)
            with pytest.raises(RequestError) as error:
                client.attention(past)
    assert ok.status_code == 200, ok.text
    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]["message"]
    assert "attention_max_length 256" in message and "\n" not in message, message
    assert "truncate" not in message, message  # truncation cuts at max_seq_length: no help here
    assert error.value.code.name == "INVALID_ARGUMENT"
    assert error.value.error_details.reason == "INVALID_INPUT"
    assert "attention_max_length 256" in error.value.details and "\n" not in error.value.details
    assert embedded.status_code == 200, embedded.text
    assert embedded.json()["usage"]["prompt_tokens"] == 3002  # embeddings go past the cap
