"""SigLIP's own SentencePiece tokenizer (transformers' SiglipTokenizer, which has no fast form), rebuilt as a tokenizers
pipeline (model/siglip_tokenizer.py): the ids of transformers' own on real and awkward texts, and a SigLIP checkpoint
that ships only its spiece.model exported and served against transformers' SiglipModel."""

from __future__ import annotations

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


def test_a_checkpoint_with_only_its_spiece_model_is_read_and_pads_as_siglip_does(tmp_path):
    """The checkpoint's tokenizer.json built from its spiece.model passes export's check against transformers'
    SiglipTokenizer, and the engine's tokenizer over it gives SigLIP's padded ids: the 64 positions, pads "</s>"
    (tests/test_siglip_serving.py serves SigLIP's text tower itself against SiglipModel)."""
    import transformers

    from attnserve.engine.tokenizer import TextTokenizer
    from attnserve.export.tokenizer_parity import check_tokenizer
    from attnserve.model.checkpoint import read_checkpoint

    checkpoint = save_tiny_siglip(tmp_path / "siglip", sentencepiece=True)
    assert (checkpoint / "spiece.model").is_file() and not (checkpoint / "tokenizer.json").exists()
    ckpt = read_checkpoint(checkpoint, "tiny-siglip-spm")
    check_tokenizer(ckpt)  # export's check: refuses on one id off
    assert (ckpt.pipeline.pad_to, ckpt.max_seq_length) == (64, 64)
    texts = ["A Photo of the CAT!", "the dog, running", "photo " * 80]  # the last past 64 tokens
    ours = TextTokenizer(ckpt.tokenizer_file, 64, ckpt.config.vocab_size, pad_to=ckpt.pipeline.pad_to,
                         pad_id=ckpt.pipeline.pad_id).encode_texts(texts)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    assert type(tokenizer).__name__ == "SiglipTokenizer"
    want = tokenizer(texts, padding="max_length", max_length=64, truncation=True)["input_ids"]
    assert [x.ids.tolist() for x in ours] == want
