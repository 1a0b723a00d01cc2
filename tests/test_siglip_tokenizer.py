"""SigLIP's own SentencePiece tokenizer (transformers' SiglipTokenizer, which has no fast form), rebuilt as a tokenizers
pipeline (model/siglip_tokenizer.py): the ids of transformers' own on real and awkward texts, and a SigLIP checkpoint
that ships only its spiece.model exported and served against transformers' SiglipModel."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnserve.export.tokenizer_parity import PROBES, SAMPLE_TEXTS
from attnserve.model.siglip_tokenizer import siglip_tokenizer
from tests.checkpoints import save_tiny_siglip, siglip_sentencepiece_tokenizer

AWKWARD = ["", "!!!", "   ", "ΣΊΣΥΦΟΣ ΟΔΟΣ.", "x\u2581y", "a-b_c(d) e.f", "¡Olé! ¿Qué?", "\u3000ideographic\u3000space",
           "ﬁ ligature ①", "MiXeD   CaSe\t\ttabs", "@mention #tag", "café, naïve"]


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    return siglip_sentencepiece_tokenizer(tmp_path_factory.mktemp("spm"))


def test_the_rebuilt_tokenizer_gives_siglip_tokenizers_ids(slow):
    """Every probe export holds tokenizers to, the sample texts and the awkward ones, cut at SigLIP's 64 tokens."""
    fast = siglip_tokenizer(slow)
    fast.enable_truncation(64)
    texts = PROBES + AWKWARD + [t for t in SAMPLE_TEXTS.read_text(encoding="utf-8").splitlines() if t.strip()]
    for text in texts:
        assert fast.encode(text).ids == slow(text, truncation=True, max_length=64)["input_ids"], text


def test_a_checkpoint_with_only_its_spiece_model_is_exported_and_embeds_as_siglip_does(tmp_path):
    import torch
    import transformers

    from attnserve.config import EngineConfig
    from attnserve.engine.engine import Engine
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint

    checkpoint = save_tiny_siglip(tmp_path / "siglip", sentencepiece=True)
    assert (checkpoint / "spiece.model").is_file() and not (checkpoint / "tokenizer.json").exists()
    out = tmp_path / "artifacts"
    build_artifacts(read_checkpoint(checkpoint, "tiny-siglip-spm"), out, log=lambda m: None, variants=["embeddings"])
    assert json.loads((out / "manifest.json").read_text())["pad_to_length"] == 64
    texts = ["A Photo of the CAT!", "the dog, running", "photo " * 80]  # the last past 64 tokens
    engine = Engine.from_directory(out, EngineConfig())
    ours = engine.encode(texts).embeddings
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    assert type(tokenizer).__name__ == "SiglipTokenizer"
    ids = tokenizer(texts, padding="max_length", max_length=64, truncation=True, return_tensors="pt")["input_ids"]
    model = transformers.SiglipModel.from_pretrained(str(checkpoint)).eval()
    with torch.no_grad():
        want = model.get_text_features(input_ids=ids)
    want = getattr(want, "pooler_output", want).numpy()
    cosines = (ours * want).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cosines.min() >= 0.99999, cosines
