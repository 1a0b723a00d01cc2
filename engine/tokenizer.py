"""Text and token-id inputs -> validated token sequences, with the engine's own truncation rules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from attnserve.errors import ArtifactError, InvalidInputError

from .shortening import exact_shortening
from .stable_prefix import StablePrefix

# Which end of an over-long input is cut: "right" keeps its beginning (the default), "left" its end.
TRUNCATION_DIRECTIONS = ("right", "left")


@dataclass(frozen=True)
class Token:
    """One token of a text as the tokenizer made it, for showing a tokenization."""

    id: int
    text: str  # the characters of the input it covers; a special token's own text
    special: bool
    start: int | None  # character offsets into the input; None for a special token
    stop: int | None


@dataclass(frozen=True)
class TokenizedInput:
    ids: np.ndarray  # (T,) int64, special tokens included
    truncated: bool
    type_ids: np.ndarray | None = None  # (T,) int64 token types; None: all zeros
    pair_start: int | None = None  # index of the first token of segment b

    def __len__(self) -> int:
        return len(self.ids)


class TextTokenizer:
    def __init__(self, path: Path, max_seq_length: int, vocab_size: int):
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception for a bad file
            raise ArtifactError(f"tokenizer unreadable: {path}: {e}") from None
        # A checkpoint's tokenizer.json carries its own settings (MiniLM's pads to
        # 128 and truncates at 128); the engine sets its own: no padding in the
        # tokenizer, truncation at max_seq_length.
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_seq_length)
        # The same tokenizer without truncation: whole tokenizations, and the probe of stable prefixes.
        self._whole = Tokenizer.from_str(self._tokenizer.to_str())
        self._whole.no_truncation()
        self._shortening = exact_shortening(self._whole)
        # A long text is tokenized only as far as its first max_seq_length tokens reach (stable_prefix.py).
        self._prefix = StablePrefix(self._whole, max_seq_length, self._shortening)
        # Truncation from the left keeps a text's last tokens: no prefix decides them, so the whole text is
        # tokenized (after the shortenings that change no id); its cost is bounded by the request's size.
        self._left = Tokenizer.from_str(self._tokenizer.to_str())
        self._left.enable_truncation(max_seq_length, direction="left")
        self.max_seq_length = max_seq_length
        self.vocab_size = vocab_size

    def encode_texts(self, texts: Sequence[str], truncate: bool = True, labels: Sequence[str] | None = None,
                     direction: str = "right") -> list[TokenizedInput]:
        """labels name each input in errors ("input 3", "line 17"); the batch runs in the tokenizers thread pool.

        direction: which end truncation cuts (TRUNCATION_DIRECTIONS).
        """
        labels = labels or [f"input {i}" for i in range(len(texts))]
        _check_texts(texts, labels)
        if direction == "left":
            shorten = self._shortening.apply if self._shortening else (lambda text: text)
            encodings = self._left.encode_batch([shorten(text) for text in texts])
        else:
            encodings = self._tokenizer.encode_batch([self._prefix.of(text) for text in texts])
        out = []
        for encoding, label in zip(encodings, labels, strict=True):
            truncated = bool(encoding.overflowing)
            if truncated and not truncate:
                raise InvalidInputError(
                    f"{label}: longer than max_seq_length {self.max_seq_length} tokens; allow truncation to cut it")
            out.append(TokenizedInput(np.asarray(encoding.ids, dtype=np.int64), truncated))
        return out

    def encode_ids(self, sequences: Sequence[Sequence[int]], truncate: bool = True,
                   labels: Sequence[str] | None = None, direction: str = "right") -> list[TokenizedInput]:
        """Pre-tokenized inputs are taken as they are (special tokens included), after range checks; truncation
        keeps the first max_seq_length ids, or with direction "left" the last."""
        labels = labels or [f"input {i}" for i in range(len(sequences))]
        out = []
        for seq, label in zip(sequences, labels, strict=True):
            ids = self._checked_ids(seq, label)
            truncated = ids.size > self.max_seq_length
            if truncated and not truncate:
                raise InvalidInputError(
                    f"{label}: {ids.size} tokens exceed max_seq_length {self.max_seq_length}; "
                    "allow truncation to cut it")
            kept = ids[-self.max_seq_length:] if direction == "left" else ids[: self.max_seq_length]
            out.append(TokenizedInput(kept, truncated))
        return out

    def _checked_ids(self, seq: Sequence[int], label: str, allow_empty: bool = False) -> np.ndarray:
        """(T,) int64 ids of the vocabulary, or an InvalidInputError naming the input."""
        try:
            ids = np.asarray(seq, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise InvalidInputError(f"{label}: token ids must be integers") from None
        if ids.ndim != 1 or (ids.size == 0 and not allow_empty):
            raise InvalidInputError(f"{label}: empty token id list")
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.size:
            raise InvalidInputError(f"{label}: token id {int(bad[0])} is out of range [0, {self.vocab_size})")
        return ids

    def token_spans(self, texts: Sequence[str], add_special_tokens: bool = True,
                    labels: Sequence[str] | None = None) -> list[list[Token]]:
        """Every token of each whole text, untruncated, with the characters it covers.

        Its cost grows with the texts' length (bounded by a request's size), unlike encode_texts's.
        """
        labels = labels or [f"input {i}" for i in range(len(texts))]
        _check_texts(texts, labels)
        out = []
        encodings = self._whole.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        for text, encoding in zip(texts, encodings, strict=True):
            out.append([
                Token(i, token, True, None, None) if special else Token(i, text[start:stop], False, start, stop)
                for i, token, special, (start, stop) in zip(
                    encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets, strict=True)])
        return out

    def decode(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = True,
               labels: Sequence[str] | None = None) -> list[str]:
        """Token ids back to text; every id must be in the vocabulary (an empty list is the empty text)."""
        labels = labels or [f"input {i}" for i in range(len(sequences))]
        checked = [self._checked_ids(seq, label, allow_empty=True).tolist()
                   for seq, label in zip(sequences, labels, strict=True)]
        return self._tokenizer.decode_batch(checked, skip_special_tokens=skip_special_tokens)

    def tokens(self, ids: np.ndarray) -> list[str]:
        """The word pieces for ids, to label attention maps."""
        return [self._tokenizer.id_to_token(int(i)) or "[UNK]" for i in ids]


def _check_texts(texts: Sequence[str], labels: Sequence[str]) -> None:
    for text, label in zip(texts, labels, strict=True):
        if not isinstance(text, str):
            raise InvalidInputError(f"{label}: text must be a string, got {type(text).__name__}")
        if not text or text.isspace():  # not text.strip(): no copy of a long text
            raise InvalidInputError(f"{label}: empty text")
