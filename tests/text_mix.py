"""Random texts that stress where a tokenizer's words begin and end, for the prefix-cut tests."""

from __future__ import annotations

import random

LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
WHITESPACE = [" ", " ", " ", "\t", "\n", "\r\n", "\xa0", "\u3000", "\u2003", "\u202f", "\x0b", "\x0c", "\x1c", "\x85"]
PUNCTUATION = "!?.,;:-_()[]{}<>\"'/\\|@#$%^&*+=~`…—«»¿¡"
SCRIPTS = ["абвгдеёжзийклмнопрстуфхцчшщъыьэюя", "αβγδεζηθικλμνξοπρσςτυφχψωΣΑΩ", "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
           "अआइईउऊएऐओऔकखगघचछजझटठडढतथदधनपफबभमयरलवशसह", "가각간갇갈감갑값강개객거건걸검겁게겨격견결",
           "ßæøåçñüöäéèêëïîôûùÿİıŁł", "ﬁﬂ㍿①ⅫＡＢＣ"]
CJK = [chr(c) for c in range(0x4E00, 0x4E00 + 400)] + [chr(c) for c in range(0x3041, 0x3097)]
EMOJI = [chr(c) for c in range(0x1F600, 0x1F650)] + ["👩\u200d💻", "👍🏽", "🇫🇷", "❤️", "1️⃣"]
MARKS = [chr(c) for c in range(0x0300, 0x0370)] + ["\u0903", "\u093e", "\u20dd"]  # Mn, Mc, Me
CONTROL = ["\x00", "\x07", "\u200b", "\ufeff", "\u200d", "\ufffd", "\x7f"]
# Added tokens of the tokenizers under test, whole and cut.
SPECIAL = ["<|end of text|>", "<|end of", "[SEP]", "[MASK]", "[CLS]", "[UNK]", "<mask>", "<s>", "</s>", "<pad>",
           "[MA", "<ma", "SK]", "[", "<"]


def _run(rng: random.Random, chars, count: int) -> str:
    return "".join(rng.choice(chars) for _ in range(count))


# (cumulative chance, a kind of piece): piece() draws its kind by these bounds.
PIECES = [
    (0.30, lambda rng: _run(rng, LETTERS, rng.randint(1, 12))),
    (0.40, lambda rng: rng.choice(WHITESPACE) * rng.choice([1, 1, 2, 3, 7, 40, 300])),
    (0.47, lambda rng: _run(rng, PUNCTUATION, rng.choice([1, 1, 2, 5, 30]))),
    (0.54, lambda rng: _run(rng, CJK, rng.randint(1, 30))),
    (0.60, lambda rng: _run(rng, EMOJI, rng.randint(1, 6))),
    # a letter with its accents: usually a few, sometimes a long combining sequence
    (0.67, lambda rng: rng.choice(LETTERS) + _run(rng, MARKS, rng.choice([1, 2, 3, 40]))),
    (0.77, lambda rng: _run(rng, rng.choice(SCRIPTS), rng.randint(1, 10))),
    (0.81, lambda rng: _run(rng, LETTERS, rng.randint(60, 400))),  # over WordPiece's 100 characters
    (0.85, lambda rng: str(rng.randint(0, 10 ** rng.randint(1, 12)))),
    (0.89, lambda rng: rng.choice(CONTROL) * rng.choice([1, 1, 5, 100])),
    (0.93, lambda rng: rng.choice(SPECIAL)),
    (1.00, lambda rng: rng.choice(WHITESPACE)),
]


def piece(rng: random.Random) -> str:
    kind = rng.random()
    return next(make for bound, make in PIECES if kind < bound)(rng)


def text_of_length(rng: random.Random, length: int) -> str:
    """About `length` characters: pieces separated by a space most of the time, cut exactly at `length`."""
    parts, size = [], 0
    while size < length:
        p = piece(rng) + (" " if rng.random() < 0.6 else "")
        parts.append(p)
        size += len(p)
    text = "".join(parts)[:length]
    return text if text.strip() else "x" + text[1:]
