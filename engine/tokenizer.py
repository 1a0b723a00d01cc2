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


@dataclass(frozen=True)
class TokenizedInput:
    ids: np.ndarray  # (T,) int64, special tokens included
    truncated: bool

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
        # A long text is tokenized only as far as its first max_seq_length tokens reach (stable_prefix.py).
        probe = Tokenizer.from_str(self._tokenizer.to_str())
        probe.no_truncation()
        self._prefix = StablePrefix(probe, max_seq_length, exact_shortening(probe))
        self.max_seq_length = max_seq_length
        self.vocab_size = vocab_size

    def encode_texts(self, texts: Sequence[str], truncate: bool = True, labels: Sequence[str] | None = None
                     ) -> list[TokenizedInput]:
        """labels name each input in errors ("input 3", "line 17"); the batch runs in the tokenizers thread pool."""
        labels = labels or [f"input {i}" for i in range(len(texts))]
        for text, label in zip(texts, labels, strict=True):
            if not isinstance(text, str):
                raise InvalidInputError(f"{label}: text must be a string, got {type(text).__name__}")
            if not text or text.isspace():  # not text.strip(): no copy of a long text
                raise InvalidInputError(f"{label}: empty text")
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
                   labels: Sequence[str] | None = None) -> list[TokenizedInput]:
        """Pre-tokenized inputs are taken as they are (special tokens included), after range checks."""
        labels = labels or [f"input {i}" for i in range(len(sequences))]
        out = []
        for seq, label in zip(sequences, labels, strict=True):
            try:
                ids = np.asarray(seq, dtype=np.int64)
            except (TypeError, ValueError, OverflowError):
                raise InvalidInputError(f"{label}: token ids must be integers") from None
            if ids.ndim != 1 or ids.size == 0:
                raise InvalidInputError(f"{label}: empty token id list")
            bad = ids[(ids < 0) | (ids >= self.vocab_size)]
            if bad.size:
                raise InvalidInputError(
                    f"{label}: token id {int(bad[0])} is out of range [0, {self.vocab_size})")
            truncated = ids.size > self.max_seq_length
            if truncated and not truncate:
                raise InvalidInputError(
                    f"{label}: {ids.size} tokens exceed max_seq_length {self.max_seq_length}; "
                    "allow truncation to cut it")
            out.append(TokenizedInput(ids[: self.max_seq_length], truncated))
        return out

    def tokens(self, ids: np.ndarray) -> list[str]:
        """The word pieces for ids, to label attention maps."""
        return [self._tokenizer.id_to_token(int(i)) or "[UNK]" for i in ids]
