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


def _word(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(LETTERS) for _ in range(length))


def piece(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.30:
        return _word(rng, rng.randint(1, 12))
    if kind < 0.40:
        return rng.choice(WHITESPACE) * rng.choice([1, 1, 2, 3, 7, 40, 300])
    if kind < 0.47:
        return "".join(rng.choice(PUNCTUATION) for _ in range(rng.choice([1, 1, 2, 5, 30])))
    if kind < 0.54:
        return "".join(rng.choice(CJK) for _ in range(rng.randint(1, 30)))
    if kind < 0.60:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 6)))
    if kind < 0.67:  # a letter with its accents: usually a few, sometimes a long combining sequence
        return rng.choice(LETTERS) + "".join(rng.choice(MARKS) for _ in range(rng.choice([1, 2, 3, 40])))
    if kind < 0.77:
        script = rng.choice(SCRIPTS)
        return "".join(rng.choice(script) for _ in range(rng.randint(1, 10)))
    if kind < 0.81:
        return _word(rng, rng.randint(60, 400))  # over WordPiece's 100 characters
    if kind < 0.85:
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))
    if kind < 0.89:
        return rng.choice(CONTROL) * rng.choice([1, 1, 5, 100])
    if kind < 0.93:
        return rng.choice(SPECIAL)
    return rng.choice(WHITESPACE)


def text_of_length(rng: random.Random, length: int) -> str:
    """About `length` characters: pieces separated by a space most of the time, cut exactly at `length`."""
    parts, size = [], 0
    while size < length:
        p = piece(rng) + (" " if rng.random() < 0.6 else "")
        parts.append(p)
        size += len(p)
    text = "".join(parts)[:length]
    return text if text.strip() else "x" + text[1:]
