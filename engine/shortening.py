"""Shortenings of a text that leave every token id unchanged, where the tokenizer's structure makes them exact.

Some inputs cost the tokenizer about 70 bytes a character (normalized copies and alignments) for next to no
tokens: megabytes of whitespace, which a BERT tokenizer drops, or one giant word, which WordPiece turns into a
single [UNK] once it is longer than max_input_chars_per_word. Two shortenings remove that cost:
- a run of whitespace that tokenizes as one space does becomes one space;
- a run of ASCII letters and digits longer than max_input_chars_per_word keeps max_input_chars_per_word + 1 of
  them: the word holding it is [UNK] either way (ASCII letters and digits never split a word, and no normalizer
  shortens them).
Both hold only where the tokenizer's pre-tokenizer splits words at whitespace and drops it (BertPreTokenizer,
Whitespace, WhitespaceSplit), its normalizers change one character at a time, and no added token (those are
matched in the raw text, before normalizing) contains whitespace, or starts with a letter or digit. Each is then
also checked against the tokenizer's own output. BERT removes some whitespace as control characters (VT, FF,
U+001C..U+001F, NEL), which joins the words around it: those fail the check and are left alone. A byte-level BPE or
a Metaspace tokenizer turns whitespace into tokens and splits any word into pieces: nothing is shortened there.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass

from tokenizers import Tokenizer

SEPARATING_PRE_TOKENIZERS = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}
PER_CHARACTER_NORMALIZERS = {"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents", "Strip"}
# Python's whitespace (str.isspace): the candidates, each checked against the tokenizer.
WHITESPACE = "".join(c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace())
WORD_CHARACTERS = "A-Za-z0-9"


@dataclass(frozen=True)
class Shortening:
    pattern: re.Pattern[str]  # the runs to shorten: group "space", whitespace; group "word", letters and digits
    word_chars: int  # how many characters a run of letters and digits keeps

    def replace(self, run: re.Match[str]) -> str:
        """What a run becomes; a run of letters and digits keeps its beginning."""
        return " " if run.lastgroup == "space" else run.group()[: self.word_chars]

    def apply(self, text: str) -> str:
        return self.pattern.sub(self.replace, text)


def exact_shortening(tokenizer: Tokenizer) -> Shortening | None:
    """tokenizer: without padding or truncation. None where no shortening is known to be exact."""
    config = json.loads(tokenizer.to_str())
    if not _separates_words_at_whitespace(config):
        return None
    runs, word_chars = [], 0
    silent = "".join(c for c in WHITESPACE if _tokenizes_as_a_space(tokenizer, c))
    if " " in silent:
        runs.append(f"(?P<space>[{re.escape(silent)}]{{2,}})")
    if config["model"]["type"] == "WordPiece":
        word_chars = config["model"]["max_input_chars_per_word"] + 1
        if _long_words_are_unknown(tokenizer, config, word_chars):
            runs.append(f"(?P<word>[{WORD_CHARACTERS}]{{{word_chars + 1},}})")
    return Shortening(re.compile("|".join(runs)), word_chars) if runs else None


def _separates_words_at_whitespace(config: dict) -> bool:
    pre_tokenizer, normalizer = config.get("pre_tokenizer") or {}, config.get("normalizer")
    if normalizer is None:
        normalizers = []
    elif normalizer["type"] == "Sequence":
        normalizers = normalizer["normalizers"]
    else:
        normalizers = [normalizer]
    return (pre_tokenizer.get("type") in SEPARATING_PRE_TOKENIZERS
            and all(n.get("type") in PER_CHARACTER_NORMALIZERS for n in normalizers)
            and not any(c.isspace() for token in config.get("added_tokens", []) for c in token["content"]))


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def _tokenizes_as_a_space(tokenizer: Tokenizer, c: str) -> bool:
    return (_ids(tokenizer, c * 3) == []
            and all(_ids(tokenizer, f"a{c * n}b") == _ids(tokenizer, "a b")
                    and _ids(tokenizer, f"a{c * n}") == _ids(tokenizer, "a")
                    and _ids(tokenizer, f"{c * n}a") == _ids(tokenizer, "a") for n in (1, 2, 3)))


def _long_words_are_unknown(tokenizer: Tokenizer, config: dict, word_chars: int) -> bool:
    """No added token can match inside a long run (they would start with a letter or digit) or across the part
    of it that is cut (they would be longer than what is kept); and the tokenizer agrees."""
    if any(re.match(f"[{WORD_CHARACTERS}]", t["content"]) or len(t["content"]) >= word_chars
           for t in config.get("added_tokens", [])):
        return False
    unknown = [tokenizer.token_to_id(config["model"]["unk_token"])]
    return all(_ids(tokenizer, f"x {run} y") == _ids(tokenizer, "x ") + unknown + _ids(tokenizer, " y")
               for run in ("a" * word_chars, "Ab9" * word_chars))
