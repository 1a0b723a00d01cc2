"""Text and token-id inputs -> validated token sequences, with the engine's own truncation rules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from attnserve.errors import ArtifactError, InputTooLongError, InvalidInputError

from .shortening import exact_shortening
from .stable_prefix import StablePrefix
from .tokenized import TokenizedInput
from .windows import Frame, Windows, windows_of

__all__ = ["TRUNCATION_DIRECTIONS", "TextTokenizer", "Token", "TokenizedInput", "check_texts"]

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


class TextTokenizer:
    def __init__(self, path: Path, max_seq_length: int, vocab_size: int, positions: int | None = None,
                 pad_to: int = 0, pad_id: int = 0, static: dict | None = None):
        """max_seq_length: the longest input served; positions: the model's own, where that is longer (a
        long-context model served up to the length memory allows: engine/manifest.py served_max_length).
        pad_to: every input padded with pad_id to this many tokens, the pads real inputs the model attends to
        (SigLIP's text tower, trained on texts padded to its 64 positions and pooling the last: model/clip.py);
        0: none (the engine pads batches itself, the pads masked).
        static: a static model's manifest entry (model/static_embedding.py): model2vec's `char_limit` (each text
        cut to it before tokenizing; 0: none) and `dropped_ids` (its unknown token, left out of every input)."""
        self.pad_to, self.pad_id = pad_to, pad_id
        self.char_limit = int(static["char_limit"]) if static else 0
        self._dropped = np.asarray(static["dropped_ids"] if static else [], dtype=np.int64)
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
        # How refusals name the limit, and why it is below the model's own where it is.
        self.limit = f"max_seq_length {max_seq_length}"
        self._why = (f" (this model's {positions} positions are served up to {max_seq_length}, the length its "
                     "export verified in the memory it has)" if positions and positions > max_seq_length else "")
        self.vocab_size = vocab_size
        # A templated reranker's body tokenizers, truncating at what its template leaves (encode_templated_pairs).
        self._body_tokenizers: dict[tuple[int, str], Tokenizer] = {}
        # A reranker template's fixed parts (prefix, suffix, sep), tokenized once, not on every request.
        self._fixed_ids: dict[str, list[int]] = {}
        self._special_ids: np.ndarray | None = None  # special_mask's, read once
        self._frame: Frame | None = None  # windows()'s special tokens around a text, read once

    def encode_texts(self, texts: Sequence[str], truncate: bool = True, labels: Sequence[str] | None = None,
                     direction: str = "right", unpooled_prompt: str = "") -> list[TokenizedInput]:
        """labels name each input in errors ("input 3", "line 17"); the batch runs in the tokenizers thread pool.

        direction: which end truncation cuts (TRUNCATION_DIRECTIONS). unpooled_prompt: the prompt each text begins
        with, where the pooling leaves it out (engine/prompts.py unpooled_prompt): each input's first
        prompt_length(prompt) tokens are marked unpooled.
        """
        check_texts(texts, labels)
        limit = self.char_limit
        cut = [len(text) > limit for text in texts] if limit else None
        if cut is not None and any(cut):  # model2vec cuts max_length x its median token length characters first
            texts = [text[:limit] for text in texts]
        # encode_batch_fast: the same ids and overflow without each token's character offsets, which nothing here reads
        # (the tokens and spans that need offsets are tokenized apart); a static model's encode is mostly this call.
        if direction == "left":
            shorten = self._shortening.apply if self._shortening else (lambda text: text)
            encodings = self._left.encode_batch_fast([shorten(text) for text in texts])
        else:
            prefix = self._prefix
            encodings = self._tokenizer.encode_batch_fast(
                [text if len(text) <= prefix.short else prefix.of(text) for text in texts])
        ids = [np.array(encoding.ids, dtype=np.int64) for encoding in encodings]
        if self._dropped.size:
            ids = self._without_dropped(ids)
        out = []
        for i, encoding in enumerate(encodings):
            was_cut = cut is not None and cut[i]
            truncated = was_cut or bool(encoding.overflowing)
            if truncated and not truncate:
                label = _label(labels, i)
                raise InputTooLongError(f"{label}: longer than {self.limit} tokens{self._why}" if not was_cut else
                                        f"{label}: longer than the {self.char_limit} characters this model2vec "
                                        "model reads (max_length x its median token length)")
            out.append(TokenizedInput(ids[i], truncated))
        if unpooled_prompt:
            out = self._unpooled(out, unpooled_prompt, labels, direction)
        return self._padded(out) if self.pad_to else out

    def _without_dropped(self, ids: list[np.ndarray]) -> list[np.ndarray]:
        """Each input's (T,) ids without the dropped ones, found in one pass over them all: the few inputs that hold
        one (a model2vec model's unknown token is rare) are cut, the others kept as they are."""
        if not ids:
            return ids
        flat = np.concatenate(ids)  # (sum T,)
        hits = np.flatnonzero(flat == self._dropped[0] if self._dropped.size == 1 else np.isin(flat, self._dropped))
        if hits.size:
            ends = np.cumsum(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)))  # (N,) each input's end
            for i in np.unique(np.searchsorted(ends, hits, side="right")):
                ids[i] = self._kept(ids[i])
        return ids

    def _kept(self, ids: np.ndarray) -> np.ndarray:
        """(T,) ids without the dropped ones (a model2vec model's unknown token): what the model averages."""
        if not self._dropped.size:
            return ids
        return ids[ids != self._dropped[0]] if self._dropped.size == 1 else ids[~np.isin(ids, self._dropped)]

    def prompt_length(self, prompt: str) -> int:
        """The prompt's tokens, special tokens left out: what NV-Embed's code leaves out of its pooling
        (len(tokenizer.tokenize(instruction)), counted from the input's first token, its BOS included)."""
        return len(self._whole.encode(prompt, add_special_tokens=False).ids)

    def _unpooled(self, inputs: list[TokenizedInput], prompt: str, labels: Sequence[str] | None, direction: str
                  ) -> list[TokenizedInput]:
        n = self.prompt_length(prompt)
        for i, x in enumerate(inputs):
            label = _label(labels, i)
            if direction == "left" and x.truncated:
                raise InvalidInputError(f"{label}: truncation from the left cut into the prompt, which this model "
                                        "leaves out of its pooling by its length: truncate from the right")
            if n >= len(x):
                raise InvalidInputError(f"{label}: the prompt's {n} tokens fill the input ({len(x)} tokens within "
                                        f"{self.limit}): no token of the text is left to pool")
        return [replace(x, unpooled=n) for x in inputs]

    def _padded(self, inputs: list[TokenizedInput]) -> list[TokenizedInput]:
        """Each input padded to pad_to with pad_id, where the model takes its texts so (pad_to)."""
        if not self.pad_to:
            return inputs
        out = []
        for x in inputs:
            pads = self.pad_to - len(x)
            out.append(x if pads <= 0 else TokenizedInput(
                np.concatenate([x.ids, np.full(pads, self.pad_id, dtype=np.int64)]), x.truncated,
                None if x.type_ids is None else np.concatenate([x.type_ids, np.zeros(pads, dtype=np.int64)]),
                x.pair_start, x.attended, x.unpooled))
        return out

    def windows(self, texts: Sequence[str], prompt: str = "", labels: Sequence[str] | None = None
                ) -> list[Windows]:
        """Each text whole, in windows of at most max_seq_length tokens, each after the prompt (engine/windows.py).
        Its cost grows with the texts (bounded by a request's size)."""
        labels = labels or [f"input {i}" for i in range(len(texts))]
        check_texts(texts, labels)
        frame = self._frame = self._frame or Frame.of(self._whole)
        return [windows_of(self._whole, frame, text, prompt, self.max_seq_length, label, self._dropped)
                for text, label in zip(texts, labels, strict=True)]

    def encode_pairs(self, pairs: Sequence[tuple[str, str]], truncate: bool = True,
                     labels: Sequence[str] | None = None, direction: str = "right") -> list[TokenizedInput]:
        """Sentence pairs (a, b) as the checkpoint's own post-processor joins them ("[CLS] a [SEP] b [SEP]" with
        type 1 for b, for BERT), cut by the tokenizers library's longest-first rule to max_seq_length.

        Memory: with direction "right" each side is tokenized only as far as its stable prefix reaches, but for
        two sides that are both too long, whose order the rule needs (see _pair); with "left" both sides are
        tokenized whole, as single texts cut from the left are. A text repeated across pairs (a rerank query) is
        tokenized whole at most once, so the cost stays bounded by the request's size.
        """
        labels = labels or [f"input {i}" for i in range(len(pairs))]
        for pair, label in zip(pairs, labels, strict=True):
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise InvalidInputError(f"{label}: a pair must be two texts")
            check_texts(pair, [f"{label}: text a", f"{label}: text b"])
        out = []
        whole_lengths: dict[str, int] = {}  # text -> its token count, for the pairs that need it
        for (a, b), label in zip(pairs, labels, strict=True):
            encoding, truncated = self._pair(a, b, direction, whole_lengths)
            if truncated and not truncate:
                raise InputTooLongError(
                    f"{label}: the pair is longer than {self.limit} tokens{self._why}")
            out.append(TokenizedInput(np.asarray(encoding.ids, dtype=np.int64), truncated,
                                      np.asarray(encoding.type_ids, dtype=np.int64), _pair_start(encoding)))
        return self._padded(out)

    def encode_templated_pairs(self, pairs: Sequence[tuple[str, str]], template: dict[str, Any],
                               truncate: bool = True, labels: Sequence[str] | None = None,
                               direction: str = "right") -> list[TokenizedInput]:
        """(query, document) pairs as one text each, as an LLM reranker's template (the manifest's pair_template,
        model/llm_reranker.py) says: its "body" style, "{prefix}{body}{suffix}" (Qwen3-Reranker's), each part
        tokenized on its own as the model card does, the prefix and suffix without special tokens, and only the body
        cut, to what max_seq_length leaves it; or its "query_document" style (_encode_query_document). Each text is
        tokenized whole before it is cut: the cost is bounded by the request's size."""
        labels = labels or [f"input {i}" for i in range(len(pairs))]
        if template.get("style") == "query_document":
            return self._encode_query_document(pairs, template, truncate, labels, direction)
        prefix, suffix = (self._template_ids(template[part]) for part in ("prefix", "suffix"))
        room = self.max_seq_length - len(prefix) - len(suffix)
        if room < 1:
            raise InvalidInputError(f"{self.limit} leaves no room between the reranker's "
                                    f"template's {len(prefix)} + {len(suffix)} tokens{self._why}")
        body_tokenizer = self._body_tokenizers.get((room, direction))
        if body_tokenizer is None:  # built once per budget: a large vocabulary takes a while to load
            body_tokenizer = Tokenizer.from_str(self._whole.to_str())
            body_tokenizer.enable_truncation(room, direction=direction)
            self._body_tokenizers[(room, direction)] = body_tokenizer
        out = []
        for (query, document), label in zip(pairs, labels, strict=True):
            body = template["body"].format(instruction=template["instruction"], query=query, document=document)
            encoding = body_tokenizer.encode(body)
            truncated = bool(encoding.overflowing)
            if truncated and not truncate:
                raise InputTooLongError(f"{label}: the pair is longer than {self.limit} tokens{self._why}")
            # Where the document begins, for attention's pair statistics: the template's text before it (prefix,
            # instruction, query) is segment a; the document and the suffix are b.
            before = template["body"].split("{document}")[0].format(instruction=template["instruction"], query=query)
            start = _token_holding(encoding, len(before))
            out.append(TokenizedInput(np.asarray(prefix + encoding.ids + suffix, dtype=np.int64), truncated,
                                      None, len(prefix) + start))
        return out

    def _template_ids(self, text: str) -> list[int]:
        """A template's fixed text's ids, without special tokens (the same list each time: callers copy it)."""
        found = self._fixed_ids.get(text)
        if found is None:
            found = self._fixed_ids[text] = self._whole.encode(text, add_special_tokens=False).ids
        return found

    def _encode_query_document(self, pairs: Sequence[tuple[str, str]], template: dict[str, Any], truncate: bool,
                               labels: Sequence[str], direction: str) -> list[TokenizedInput]:
        """prefix + query + sep + document + suffix, each part tokenized alone without special tokens, as
        mxbai-rerank's MxbaiRerankV2.prepare_inputs and FlagLLMReranker.compute_score build a pair, cut by their
        max_length L: the query at L * 3 // 4 tokens, the document at L (and at document_budget less the query's
        tokens, where there is one), then sep + document from its end so that the pair (the prefix too where
        prefix_in_pair) holds at most L + pair_extra tokens, as transformers' truncation "only_second" cuts (not at
        all where it would take the whole second part). Served below the template's longest pair, L is what fits:
        the reference run with that max_length. direction "left" keeps each cut part's last tokens instead."""
        def ids(text: str) -> list[int]:
            return self._whole.encode(text, add_special_tokens=False).ids

        def cut(tokens: list[int], most: int) -> list[int]:
            return tokens[len(tokens) - most:] if direction == "left" else tokens[:most]

        prefix = [i for part in template["prefix"] for i in self._template_ids(part)]
        suffix = [i for part in template["suffix"] for i in self._template_ids(part)]
        sep = self._template_ids(template["sep"])
        counted = len(prefix) if template["prefix_in_pair"] else 0
        longest = len(prefix) - counted + template["max_length"] + template["pair_extra"] + len(suffix)
        length = template["max_length"] - max(0, longest - self.max_seq_length)  # L, or what fits the served length
        if length < 4:
            raise InvalidInputError(f"{self.limit} leaves no room between the reranker's template's "
                                    f"{longest - template['max_length']} tokens{self._why}")
        pair_max = length + template["pair_extra"]
        queries: dict[str, list[int]] = {}  # a rerank's one query, tokenized once for all its pairs
        out = []
        for (query, document), label in zip(pairs, labels, strict=True):
            if query not in queries:
                queries[query] = ids(template["query"].format(query=query))
            whole_query = queries[query]
            query_ids = cut(whole_query, length * 3 // 4)
            most = length
            if template["document_budget"] is not None:
                most = min(most, template["document_budget"] - len(query_ids))
            whole_document = ids(template["document"].format(document=document))
            second = sep + cut(whole_document, most)
            remove = counted + len(query_ids) + len(second) - pair_max
            if 0 < remove < len(second):
                second = second[remove:] if direction == "left" else second[:len(second) - remove]
            truncated = len(query_ids) < len(whole_query) or len(second) < len(sep) + len(whole_document)
            if truncated and not truncate:
                raise InputTooLongError(f"{label}: the pair is longer than the reranker's template keeps "
                                        f"({length * 3 // 4} tokens of the query, {pair_max} of the query and the "
                                        f"document){self._why}")
            out.append(TokenizedInput(np.asarray(prefix + query_ids + second + suffix, dtype=np.int64), truncated,
                                      None, len(prefix) + len(query_ids) + len(sep)))
        return out

    def _pair(self, a: str, b: str, direction: str, whole_lengths: dict[str, int]):
        """The pair's encoding cut longest-first, from a bounded part of each side; and whether it was cut.

        Each side is tokenized without special tokens, clipped, and the two are joined by the tokenizer's own
        truncation and post-processor (Tokenizer.post_process). Never the library's pair encoding of whole
        texts: its overflowing windows are the product of the two sides' windows, quadratic in their length.

        Why clipped sides give the whole texts' result. Let t = max_seq_length less the pair's special tokens and
        K = max_seq_length less one text's special tokens, plus 1 (the tokens a stable prefix fixes,
        stable_prefix.py); pair templates add at least as many special tokens as single ones, so K >= t + 1. The
        longest-first rule of `tokenizers` (utils/truncation.rs, kept from its legacy code) sees only the two
        lengths la, lb: with s the shorter (a on a tie), nothing is cut if la + lb <= t; else if s <= t / 2 the
        shorter keeps s and the longer t - s, otherwise the shorter keeps t // 2 and the longer t - t // 2.
        Each side keeps at most t < K tokens, its first (or, cut from the left, its last) ones. Clip each length
        to min(l, K): a side that reached K has l >= K > t, so la + lb > t either way (the pair is cut in both),
        and min(l, K) > t / 2 exactly when l > t / 2, so every branch is the same; only which side is shorter can
        change, when both reached K. That matters only for odd t (the shorter keeps one token fewer): then the
        shorter is clipped to K - 1 instead (still > t / 2, and >= every kept length).

        Cut from the right, a side's first K tokens come from its stable prefix (its cost bounded by
        max_seq_length); the lengths of two sides that both reached K are then unknown, and for odd t both are
        tokenized whole to compare them (cost bounded by the request). Cut from the left, a side's last tokens
        are decided by no prefix, so both sides are tokenized whole, as single texts cut from the left are.
        """
        k = self._prefix.stable_tokens
        shorten = self._shortening.apply if self._shortening else (lambda text: text)
        if direction == "left":
            ea, eb = (self._whole.encode(shorten(x), add_special_tokens=False) for x in (a, b))
            la, lb = len(ea.ids), len(eb.ids)
        else:
            ea, eb = (self._whole.encode(self._prefix.of(x), add_special_tokens=False) for x in (a, b))
            la, lb = len(ea.ids), len(eb.ids)  # exact below k; at least k (and only that known) otherwise
        t = self.max_seq_length - self._whole.num_special_tokens_to_add(True)
        clip_a = clip_b = k
        if la >= k and lb >= k and t % 2:
            if direction != "left":
                for x in (a, b):
                    if x not in whole_lengths:
                        whole_lengths[x] = len(self._whole.encode(shorten(x), add_special_tokens=False).ids)
                la, lb = whole_lengths[a], whole_lengths[b]
            if la > lb:
                clip_b = k - 1  # b is shorter; on a tie a counts as shorter, as clipping both to k says
        ea.truncate(clip_a, direction=direction)
        eb.truncate(clip_b, direction=direction)
        truncated = len(ea.ids) + len(eb.ids) > t
        joiner = self._left if direction == "left" else self._tokenizer
        return joiner.post_process(ea, eb), truncated

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
                raise InputTooLongError(f"{label}: {ids.size} tokens exceed {self.limit}{self._why}")
            kept = ids[-self.max_seq_length:] if direction == "left" else ids[: self.max_seq_length]
            out.append(TokenizedInput(self._kept(kept), truncated))
        return self._padded(out)

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
        check_texts(texts, labels)
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

    def special_mask(self, ids: np.ndarray) -> np.ndarray:
        """(T,) ids -> (T,) bool: which are the tokenizer's special tokens ([CLS], [SEP], <s>, </s>...)."""
        if self._special_ids is None:
            self._special_ids = np.array(sorted(i for i, t in self._tokenizer.get_added_tokens_decoder().items()
                                                if t.special), dtype=np.int64)
        return np.isin(ids, self._special_ids)


def _token_holding(encoding, char: int) -> int:
    """The index of the encoding's token that holds the text's character `char`: the first that ends after it (a
    byte-level BPE joins the space before a word to it). The encoding's length when none does: that part was cut."""
    for index, (_, end) in enumerate(encoding.offsets):
        if end > char:
            return index
    return len(encoding.ids)


def _pair_start(encoding) -> int:
    """The index of segment b's first token: its first token of sequence 1, or where it would be if empty."""
    sequences = encoding.sequence_ids
    for i, sequence in enumerate(sequences):
        if sequence == 1:
            return i
    # Segment b kept no token (a text of characters the normalizer removes): after segment a and its separators.
    return max((i for i, sequence in enumerate(sequences) if sequence == 0), default=0) + 1


def check_texts(texts: Sequence[str], labels: Sequence[str] | None) -> None:
    """Each text a string with something in it; labels name them in errors (None: "input i")."""
    if labels is not None and len(labels) != len(texts):
        raise ValueError(f"{len(labels)} labels for {len(texts)} texts")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInputError(f"{_label(labels, i)}: text must be a string, got {type(text).__name__}")
        if not text or text.isspace():  # not text.strip(): no copy of a long text
            raise InvalidInputError(f"{_label(labels, i)}: empty text")


def _label(labels: Sequence[str] | None, i: int) -> str:
    """How errors name input i: its label, or "input i" where none were given (made only for an error)."""
    return f"input {i}" if labels is None else labels[i]
