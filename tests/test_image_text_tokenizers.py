"""Image-text models' real tokenizers. CLIP's 49,408-token byte-level BPE (OpenAI's, every CLIPModel checkpoint's),
read from open_clip's wheel on the package index (bpe_simple_vocab_16e6.txt.gz; no weights ship there, so the towers
are small and random), in transformers' CLIPTokenizer class with a config as openai/clip-vit-* have it (eos_token_id
2: the end of text found as the highest id), exported and embedding texts as CLIPModel does. SigLIP's SentencePiece
tokenizer (transformers' SiglipTokenizer, which has no fast form) rebuilt as a tokenizers pipeline
(model/siglip_tokenizer.py): its ids on real and awkward texts, and a checkpoint that ships only its spiece.model."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from attnserve.export.tokenizer_parity import PROBES, SAMPLE_TEXTS
from attnserve.model.siglip_tokenizer import siglip_tokenizer
from tests.checkpoints import TINY_TOWER, save_tiny_siglip, siglip_sentencepiece_tokenizer

OPEN_CLIP = "open_clip_torch==3.3.0"
TEXTS = ["a photo of a cat", "A PHOTO of a Cat!!", "très jolie, naïve café", "emoji 🐱 and 東京タワー",
         "the dog " * 60]  # the last past 77 tokens
AWKWARD = ["", "!!!", "   ", "ΣΊΣΥΦΟΣ ΟΔΟΣ.", "x\u2581y", "a-b_c(d) e.f", "¡Olé! ¿Qué?", "\u3000ideographic\u3000space",
           "ﬁ ligature ①", "MiXeD   CaSe\t\ttabs", "@mention #tag", "café, naïve"]


def open_clip_wheel() -> Path:
    """open_clip's wheel (1.5 MB), downloaded once from the package index into a cache outside the checkout; its code
    is never imported (it needs torchvision), only its vocabulary file read."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attnserve-tests" / "open_clip"
    wheels = sorted(cache.glob("open_clip_torch-3.3.0-*.whl"))
    if not wheels:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", OPEN_CLIP, "-d", str(cache)],
                              capture_output=True, text=True, timeout=300)
        wheels = sorted(cache.glob("open_clip_torch-3.3.0-*.whl"))
        if done.returncode or not wheels:
            message = f"cannot download {OPEN_CLIP} from the package index: {done.stderr.strip()[-300:]}"
            if os.environ.get("CI"):
                pytest.fail(f"{message}; CI must run the real-vocabulary CLIP tests", pytrace=False)
            pytest.skip(message)
    return wheels[-1]


def clip_vocabulary_tokenizer():
    """transformers' CLIPTokenizer over CLIP's own vocabulary, built as open_clip's SimpleTokenizer builds it: the 256
    byte characters, each as a word's end, the 48,894 merges, then <|startoftext|> and <|endoftext|>."""
    import transformers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    with zipfile.ZipFile(open_clip_wheel()) as wheel:
        lines = gzip.decompress(wheel.read("open_clip/bpe_simple_vocab_16e6.txt.gz")).decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1:49152 - 256 - 2 + 1]]
    characters = list(bytes_to_unicode().values())
    tokens = characters + [c + "</w>" for c in characters] + ["".join(m) for m in merges] + [
        "<|startoftext|>", "<|endoftext|>"]
    return transformers.CLIPTokenizerFast(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)


def test_texts_embed_as_clip_does_with_its_real_vocabulary(tmp_path):
    """Export holds tokenizer.json to transformers' CLIPTokenizer on its probes and sample texts (or refuses); the
    engine's text embeddings then equal CLIPModel's get_text_features on the same texts: cased, punctuated,
    accented, emoji, CJK and past the 77 positions."""
    import torch
    import transformers

    from attnserve.config import EngineConfig
    from attnserve.engine.engine import Engine
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint

    tokenizer = clip_vocabulary_tokenizer()
    assert len(tokenizer) == 49408
    assert tokenizer("a photo of a cat")["input_ids"] == [49406, 320, 1125, 539, 320, 2368, 49407]  # OpenAI's ids
    checkpoint = tmp_path / "model"
    torch.manual_seed(0)
    config = transformers.CLIPConfig(
        text_config={**TINY_TOWER, "vocab_size": 49408, "eos_token_id": 2, "bos_token_id": 0, "pad_token_id": 1},
        vision_config={**TINY_TOWER, "image_size": 32, "patch_size": 8}, projection_dim=32)
    transformers.CLIPModel(config).eval().save_pretrained(str(checkpoint), safe_serialization=True)
    processor = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    transformers.CLIPProcessor(image_processor=processor, tokenizer=tokenizer).save_pretrained(str(checkpoint))
    out = tmp_path / "artifacts"
    build_artifacts(read_checkpoint(checkpoint, "clip-vocabulary"), out, log=lambda m: None, variants=["embeddings"])
    encoded = Engine.from_directory(out, EngineConfig()).encode(TEXTS)
    batch = transformers.AutoTokenizer.from_pretrained(str(checkpoint))(TEXTS, padding=True, truncation=True,
                                                                        max_length=77, return_tensors="pt")
    assert list(encoded.num_tokens) == batch["attention_mask"].sum(-1).tolist()  # 77 for the long one
    model = transformers.CLIPModel.from_pretrained(str(checkpoint)).eval()
    with torch.no_grad():
        want = model.get_text_features(**batch)
    want = getattr(want, "pooler_output", want).numpy()
    ours = encoded.embeddings
    cosines = (ours * want).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cosines.min() >= 0.99999, cosines


def test_the_rebuilt_siglip_tokenizer_gives_siglip_tokenizers_ids(tmp_path):
    """Every probe export holds tokenizers to, the sample texts and the awkward ones, cut at SigLIP's 64 tokens."""
    slow = siglip_sentencepiece_tokenizer(tmp_path)
    fast = siglip_tokenizer(slow)
    fast.enable_truncation(64)
    texts = PROBES + AWKWARD + [t for t in SAMPLE_TEXTS.read_text(encoding="utf-8").splitlines() if t.strip()]
    for text in texts:
        assert fast.encode(text).ids == slow(text, truncation=True, max_length=64)["input_ids"], text


def test_a_siglip_checkpoint_with_only_its_spiece_model_is_read_and_pads_as_siglip_does(tmp_path):
    """The checkpoint's tokenizer.json built from its spiece.model passes export's check against transformers'
    SiglipTokenizer, and the engine's tokenizer over it gives SigLIP's padded ids: the 64 positions, pads "</s>"
    (tests/test_image_serving.py serves SigLIP's text tower itself against SiglipModel)."""
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
