"""The part of a long text that decides its first max_seq_length tokens, so that the cost of tokenizing a text
depends on the model's limit and not on the text's length.

Tokenizing a whole text of megabytes to keep 256 tokens costs gigabytes (every token of the text, its overflow
encodings and the normalized copies, much of which the allocator keeps afterwards). A prefix of the text gives
exactly the same ids and `truncated` when the truncated tokens of the whole text all lie in the prefix and the
end of the prefix cannot have changed them. The tokenizer's own output decides that, for any kind of tokenizer:
the prefix is encoded without special tokens, and its tokens are grouped by the pre-tokenizer's words. The first
`budget + 1` tokens (budget: max_seq_length less the special tokens) are stable when
- the word holding token `budget` is followed by a whole word and then by the last word of the prefix, which the
  cut may have split: text after the prefix can continue that last word, not the words before it;
- they end at least `margin` characters before the prefix does: an added token ("[SEP]", matched before
  normalizing) or a normalizer's or pre-tokenizer's look-ahead reaching across the cut would otherwise change them.
Those are the ways in which text after a point changes the tokens before it in the `tokenizers` pipeline; the
tests check the rule at every cut of random texts, for WordPiece, byte-level BPE and Unigram tokenizers. Then the
whole text has the same first `budget + 1` tokens, so it is truncated, and encoding the prefix with the engine's
own truncation gives its ids. The prefix grows (doubling) while that does not hold; past a bound the
whole text is tokenized. All of this is done on the text after the shortenings that cannot change a token id
(shortening.py: for BERT, runs of whitespace and giant ASCII words), which then cost nothing.

Costs: the prefix is at most MAX_CHARS_PER_TOKEN * max_seq_length characters, about 70 bytes a character inside
the tokenizer (130 for accented letters). A text whose first max_seq_length tokens are not found within that (a
giant word that is not shortened, a long run of characters that the normalizer removes, a long run of whitespace
that a byte-level BPE turns into tokens) is tokenized whole, at that cost per character of the text.
"""

from __future__ import annotations

from tokenizers import Tokenizer

from .shortening import Shortening

# The first prefix: English takes 4 to 5 characters a token, so 8 nearly always gives budget + 1 stable tokens.
FIRST_CHARS_PER_TOKEN = 8
# The longest prefix tried before tokenizing the whole text: room for words of hundreds of characters.
MAX_CHARS_PER_TOKEN = 1024
# How far the end of a text may reach back into the tokens before it, beyond the longest added token: a
# normalizer's look-ahead (a combining sequence, a charsmap entry) or a pre-tokenizer's regex look-ahead.
CONTEXT_CHARS = 32


class StablePrefix:
    def __init__(self, probe: Tokenizer, max_seq_length: int, shortening: Shortening | None):
        """probe: the engine's tokenizer without truncation or padding; shortening: from
        shortening.exact_shortening."""
        self._probe = probe
        self._budget = max_seq_length - probe.num_special_tokens_to_add(False)
        # How many first tokens (special tokens not counted) of a text its prefix gives exactly.
        self.stable_tokens = self._budget + 1
        # A text at most this long is tokenized as it is (of() gives it back).
        self.short = FIRST_CHARS_PER_TOKEN * max_seq_length
        self._max = MAX_CHARS_PER_TOKEN * max_seq_length
        self._margin = max((len(t.content) for t in probe.get_added_tokens_decoder().values()), default=0) \
            + CONTEXT_CHARS
        self._shortening = shortening

    def of(self, text: str) -> str:
        """The text to tokenize in place of `text`: the same ids and `truncated` under the engine's truncation."""
        if len(text) <= self.short:
            return text
        size = self.short
        while size <= self._max:
            prefix, whole = self._shortened_prefix(text, size)
            if whole or self.is_stable(prefix):
                return prefix
            size *= 2
        return self._shortening.apply(text) if self._shortening else text

    def _shortened_prefix(self, text: str, size: int) -> tuple[str, bool]:
        """The first `size` characters of the shortened text, never copying more of the text than that, and
        whether they are all of it."""
        shortening = self._shortening
        if shortening is None:
            return text[:size], len(text) <= size
        pieces, length, pos = [], 0, 0
        while length < size and pos < len(text):
            stop = pos + size - length
            # A run long enough to shorten that starts before `stop` is found within one more character; one
            # that is not found there is cut by `stop` where its shortening would keep it.
            found = shortening.pattern.search(text, pos, stop + 1)
            if found is None:
                pieces.append(text[pos:stop])
                length, pos = length + len(pieces[-1]), min(stop, len(text))
            else:
                run = shortening.pattern.match(text, found.start())  # all of it, past stop + 1
                # It matches where the search found it: the pattern is runs of characters, with no look-ahead
                # that the text past stop + 1 could defeat.
                assert run is not None
                pieces += [text[pos:run.start()], shortening.replace(run)]
                length, pos = length + run.start() - pos + len(pieces[-1]), run.end()
        return "".join(pieces)[:size], pos >= len(text) and length <= size

    def is_stable(self, prefix: str) -> bool:
        """Whether the prefix's first budget + 1 tokens are those of any text that starts with it."""
        encoding = self._probe.encode(prefix, add_special_tokens=False)
        words = encoding.word_ids  # a token without a word is a word of its own
        if len(words) <= self._budget:
            return False

        def word_end(i: int) -> int:
            """The index after the last token of the word holding token i."""
            j = i + 1
            while j < len(words) and words[i] is not None and words[j] == words[i]:
                j += 1
            return j

        end = word_end(self._budget)
        if end == len(words) or word_end(end) == len(words):
            return False
        return max(stop for _, stop in encoding.offsets[:end]) <= len(prefix) - self._margin
