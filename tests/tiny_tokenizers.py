"""Small tokenizers of other kinds than BERT's, trained in a second from an in-test corpus with the `tokenizers`
library itself: byte-level BPE as RoBERTa and ModernBERT build it, and Unigram over Metaspace as XLM-R builds it."""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from .text_mix import text_of_length

# <mask> takes the whitespace before it, as RoBERTa's does; "<|end of text|>" is an added token of several words.
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", AddedToken("<mask>", lstrip=True, special=True), "<|end of text|>"]


def corpus() -> list[str]:
    rng = random.Random(1)
    english = "the quick brown fox jumps over the lazy dog while tokenizers learn which pieces come often " * 20
    return [english] + [text_of_length(rng, 400) for _ in range(200)]


def byte_level_bpe(specials: list, nfc: bool = False) -> Tokenizer:
    """Byte-level BPE of 600 pieces without a prefix space, trained on corpus(): whitespace becomes tokens ("Ġ")."""
    tokenizer = Tokenizer(models.BPE())
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=600, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return tokenizer


def bracketed(tokenizer: Tokenizer, first: str, last: str, out: Path) -> Path:
    """"first $A last" around a text ("first $A last $B last" around a pair), saved to `out`."""
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{first} $A {last}", pair=f"{first} $A {last} $B {last}",
        special_tokens=[(first, tokenizer.token_to_id(first)), (last, tokenizer.token_to_id(last))])
    tokenizer.save(str(out))
    return out


def roberta_style(out: Path, nfc: bool = False) -> Path:
    """Byte-level BPE: whitespace becomes tokens ("Ġ"), offsets trimmed, <mask> takes the space before it."""
    tokenizer = byte_level_bpe(SPECIALS, nfc)
    tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", tokenizer.token_to_id("</s>")), ("<s>", tokenizer.token_to_id("<s>")), trim_offsets=True)
    tokenizer.save(str(out))
    return out


def xlmr_style(out: Path, pairs: bool = False) -> Path:
    """Unigram over Metaspace ("▁word"), NFKC and runs of spaces made one, as XLM-R's tokenizer.json does; pairs:
    "<s> A </s> </s> B </s>" as bge-reranker-v2-m3's has it (all of type 0)."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(corpus(), trainers.UnigramTrainer(
        vocab_size=2000, special_tokens=SPECIALS, unk_token="<unk>", show_progress=False))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>" if pairs else None,
        special_tokens=[("<s>", tokenizer.token_to_id("<s>")), ("</s>", tokenizer.token_to_id("</s>"))])
    tokenizer.save(str(out))
    return out


# ModernBERT's tokenizer (OLMo's byte-level BPE) has added tokens for runs of 2 to 24 spaces, matched before
# the pre-tokenizer, and BERT's specials with [MASK] taking the whitespace before it.
MODERNBERT_SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", AddedToken("[MASK]", lstrip=True, special=True)]
SPACE_RUNS = [AddedToken(" " * n, normalized=True, special=False) for n in range(24, 1, -1)]


def modernbert_style(out: Path) -> Path:
    """Byte-level BPE over NFC, "[CLS] $A [SEP]" around each text, and the added tokens above."""
    tokenizer = byte_level_bpe(MODERNBERT_SPECIALS, nfc=True)
    tokenizer.add_tokens(SPACE_RUNS)
    return bracketed(tokenizer, "[CLS]", "[SEP]", out)
