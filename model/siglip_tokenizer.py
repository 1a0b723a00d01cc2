"""SigLIP's SentencePiece tokenizer as a `tokenizers` pipeline: transformers' SiglipTokenizer, which has no fast
form, rebuilt step for step so that the engine's one tokenizer (tokenizers, in Rust) serves SigLIP's texts.

transformers' SiglipTokenizer (big_vision's text preprocessing) does, for each text between special tokens:
1. canonicalize: lowercase (do_lower_case), drop ASCII punctuation (string.punctuation), every run of whitespace
   (Python's) one space, stripped;
2. "▁" before the text, then SentencePiece's encode (its own normalizer: the model's precompiled character map,
   extra spaces removed, spaces escaped as "▁"), through a Unigram model;
3. "</s>" after the ids.
Here the same as normalizers before the model's own (transformers' SpmConverter.build_tokenizer_from_spm_proto, which
follows the SentencePiece model's normalizer spec), the "▁" put after them (SentencePiece reads it after the "<unk>"
transformers puts first and cuts off again, so its own normalizer strips it not), words split at "▁", and a template
adding "</s>". Where a text itself holds a special token, transformers reads the words after it without a word
start; here they have one (a known difference, docs/image-models.md).

Python lowercases a capital sigma at a word's end to the final sigma (ς); tokenizers lowercases each character alone
(σ): a final capital sigma is made ς before lowercasing. export/tokenizer_parity.py then holds the result to
transformers' own SiglipTokenizer on real and awkward texts, as every built tokenizer is held, and refuses it
where one id differs.
"""

from __future__ import annotations

import re
import string
import sys
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers, processors

# Python's whitespace (str.isspace, what re's \s and str.strip take), spelled out: Oniguruma's \s is another set.
PYTHON_WHITESPACE = "".join(c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace())
WHITESPACE_CLASS = "[" + "".join(f"\\x{{{ord(c):x}}}" for c in PYTHON_WHITESPACE) + "]"
PUNCTUATION_CLASS = "[" + re.escape(string.punctuation) + "]"
# A capital sigma after a letter and before none: Python's lower() makes it the final sigma.
FINAL_SIGMA = Regex(r"(?<=\p{L})Σ(?!\p{L})")


def siglip_tokenizer(slow: Any) -> Tokenizer:
    """transformers' SiglipTokenizer (its spiece.model, do_lower_case, special tokens) -> a tokenizers.Tokenizer
    that gives its ids."""
    from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf

    proto = import_protobuf().ModelProto()
    with open(slow.vocab_file, "rb") as f:
        proto.ParseFromString(f.read())
    vocab = [(piece.piece, piece.score) for piece in proto.pieces]
    tokenizer = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab, legacy=False)
    if tokenizer is None:
        raise ValueError("the SentencePiece model's vocabulary is not one tokenizers builds")
    canonicalize: list[normalizers.Normalizer] = []
    if slow.do_lower_case:
        canonicalize += [normalizers.Replace(FINAL_SIGMA, "ς"), normalizers.Lowercase()]
    canonicalize += [normalizers.Replace(Regex(PUNCTUATION_CLASS), ""),
                     normalizers.Replace(Regex(WHITESPACE_CLASS + "+"), " "),
                     normalizers.Replace(Regex(rf"\A{WHITESPACE_CLASS}+|{WHITESPACE_CLASS}+\z"), "")]
    spm_own = [tokenizer.normalizer] if tokenizer.normalizer is not None else []
    # transformers puts "▁" before the text itself, whatever the model's add_dummy_prefix says; SentencePiece reads
    # it after "<unk>" (module docstring), so its normalizer strips it not: it is put after that normalizer.
    tokenizer.normalizer = normalizers.Sequence(canonicalize + spm_own + [normalizers.Prepend("▁")])
    # Each word segmented alone: SentencePiece's float32 scores tie-break near-equal segmentations of a word by where
    # it stands in a long text; alone, a word is segmented by its best score (the same within SigLIP's 64 tokens).
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    specials = [str(t) for t in (slow.unk_token, slow.eos_token, slow.pad_token) if t is not None]
    tokenizer.add_special_tokens([AddedToken(t, lstrip=True, rstrip=True, normalized=False, special=True)
                                  for t in dict.fromkeys(specials)])
    eos = str(slow.eos_token)
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {eos}", pair=f"$A {eos} $B {eos}",
                                                             special_tokens=[(eos, slow.eos_token_id)])
    return tokenizer
