"""A long text is tokenized only as far as its first max_seq_length tokens reach, with the ids and `truncated` of
the whole text, for BERT's WordPiece, byte-level BPE (RoBERTa's and ModernBERT's) and Unigram tokenizers; and a
4 MiB text costs the server what max_seq_length allows, not what the text's length would."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from attnserve.client.client import make_request
from attnserve.engine.shortening import exact_shortening
from attnserve.engine.stable_prefix import FIRST_CHARS_PER_TOKEN, MAX_CHARS_PER_TOKEN, StablePrefix
from attnserve.engine.tokenizer import TextTokenizer

from .serving import ServerProcess, serving
from .test_server_memory import status_mib, wait_idle
from .text_mix import CJK, EMOJI, MARKS, text_of_length
from .tiny_tokenizers import modernbert_style, roberta_style, xlmr_style

KINDS = ["wordpiece", "byte-level-bpe", "byte-level-bpe-nfc", "modernbert-bpe", "unigram"]


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory, artifacts) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("tokenizers")
    return {"wordpiece": artifacts / "tokenizer.json",
            "byte-level-bpe": roberta_style(out / "bbpe.json"),
            "byte-level-bpe-nfc": roberta_style(out / "bbpe_nfc.json", nfc=True),
            "modernbert-bpe": modernbert_style(out / "modernbert.json"),
            "unigram": xlmr_style(out / "unigram.json")}


def load(path: Path, max_seq_length: int | None = None) -> Tokenizer:
    """The tokenizer without padding, truncating (where max_seq_length is given) as the engine truncates."""
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    if max_seq_length:
        tokenizer.enable_truncation(max_seq_length)
    return tokenizer


def whole(path: Path, max_seq_length: int, text: str) -> tuple[list[int], bool]:
    """The reference: the whole text through the tokenizer, truncated as the engine truncates."""
    encoding = load(path, max_seq_length).encode(text)
    return encoding.ids, bool(encoding.overflowing)


@pytest.mark.parametrize("kind", KINDS)
def test_every_prefix_called_stable_gives_the_whole_texts_ids(tokenizer_files, kind):
    """The rule itself, at every cut: wherever a prefix is called stable, it encodes as the whole text does."""
    path, rng, checked = tokenizer_files[kind], random.Random(0), 0
    for max_seq_length in (4, 8):
        stable, reference = StablePrefix(load(path), max_seq_length, None), load(path, max_seq_length)
        for _ in range(12):
            text = text_of_length(rng, 160)
            expected = reference.encode(text)
            for n in range(1, len(text)):
                if stable.is_stable(text[:n]):
                    got = reference.encode(text[:n])
                    assert (got.ids, bool(got.overflowing)) == (expected.ids, bool(expected.overflowing)), \
                        (max_seq_length, text, n)
                    checked += 1
    assert checked > 500  # the cuts checked were many, not a lucky few


def long_texts(rng: random.Random, max_seq_length: int) -> list[str]:
    """Lengths around each threshold and far past the last, plus the shapes that defeat a naive cut."""
    first, last = FIRST_CHARS_PER_TOKEN * max_seq_length, MAX_CHARS_PER_TOKEN * max_seq_length
    lengths = [first - 1, first, first + 1, 2 * first + 3, 9 * first, last - 1, last + 1, 3 * last]
    texts = [text_of_length(rng, n) for n in lengths for _ in range(3)]
    words = text_of_length(rng, 40 * max_seq_length)
    return texts + [
        " " * (last + 1) + words,                                # whitespace past the longest prefix, then words
        "\t\n\u3000\xa0 " * (last // 5 + 1) + words,             # mixed whitespace, then the words
        "\x0b\x0c " * (2 * first) + words,                       # whitespace that BERT removes, joining words
        "x" * (last + 1) + " " + words,                          # one giant word, then more
        "ü" * (last + 1) + " " + words,                          # one that is not shortened
        "".join(rng.choice(CJK) for _ in range(3 * first)),      # CJK without spaces
        "".join(rng.choice(EMOJI) for _ in range(3 * first)),    # emoji, joined and modified
        "".join(rng.choice("aeiou") + rng.choice(MARKS) * rng.randint(1, 4) for _ in range(3 * first)),
        "[SEP]<mask><|end of text|>" * first,                    # added tokens all the way
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_long_texts_encode_as_the_whole_text(tokenizer_files, kind):
    path, rng = tokenizer_files[kind], random.Random(1)
    for max_seq_length in (8, 16):
        ours = TextTokenizer(path, max_seq_length, 10**6)
        texts = long_texts(rng, max_seq_length)
        for text, got in zip(texts, ours.encode_texts(texts), strict=True):
            assert (got.ids.tolist(), got.truncated) == whole(path, max_seq_length, text), text[:80]
        cut = sum(len(ours._prefix.of(t)) < len(t) for t in texts)
        assert cut >= len(texts) // 2  # most took the short way


def test_minilm_at_its_own_limit(tokenizer_files):
    path, rng = tokenizer_files["wordpiece"], random.Random(2)
    ours = TextTokenizer(path, 256, 30522)
    texts = [text_of_length(rng, n) for n in (2047, 2049, 3000, 5000, 20000)] + ["short " * 3000]
    for text, got in zip(texts, ours.encode_texts(texts), strict=True):
        assert (got.ids.tolist(), got.truncated) == whole(path, 256, text)
        assert len(got) <= 256


def test_shortening_only_where_no_token_id_changes(tokenizer_files):
    bert = load(tokenizer_files["wordpiece"])
    shortening = exact_shortening(bert)
    assert shortening.apply(" \t\n\r\xa0\u3000\u2003\u202f") == " "
    for removed in "\x0b\x0c\x1c\x1f\x85":  # control characters to BERT: removed, which joins the words around
        assert shortening.apply(removed * 2) == removed * 2
    assert shortening.apply("a" * 10_000) == "a" * 101  # over max_input_chars_per_word (100): [UNK] either way
    assert shortening.apply("é" * 500 + "Ω" * 500) == "é" * 500 + "Ω" * 500  # only ASCII letters and digits
    rng = random.Random(3)
    for _ in range(200):
        text = text_of_length(rng, 600)
        assert bert.encode(shortening.apply(text)).ids == bert.encode(text).ids
    for kind in ("byte-level-bpe", "modernbert-bpe", "unigram"):  # whitespace is tokens there, words are pieces
        assert exact_shortening(Tokenizer.from_file(str(tokenizer_files[kind]))) is None


def memory_mb(pid: int) -> dict[str, float]:
    return {field: status_mib(pid, field) for field in ("VmRSS", "VmHWM")}


SERVER_GROWTH_BOUND_MB = 100
# A 4 MiB text raised the server's peak by 20 to 250 MB (60 per byte of UTF-8 at most), in the heaps of the
# threads that took and tokenized it, by the server's state (its first start's calibration runs, say): bounded by
# the request size limit, freed after. The 2 GB it cost before is 500 bytes a byte; this bound is twice the worst
# seen and a quarter of that.
SERVER_PEAK_PER_REQUEST_BYTE = 128


def settled_memory_mb(pid: int, bound_mb: float, seconds: float = 40) -> dict[str, float]:
    """The server's memory once its idle trims (server/memory.py TRIM_DELAYS: 1, 3, 7, 15 and 31 s after the last
    request) have brought its RSS within bound_mb, or after `seconds`."""
    until = time.monotonic() + seconds
    while (memory := memory_mb(pid))["VmRSS"] > bound_mb and time.monotonic() < until:
        time.sleep(0.2)
    return memory


def test_a_4_mib_text_costs_the_server_what_max_seq_length_allows(artifacts, tmp_path):
    """Before: one such text grew the server by 2 GB, 1.2 GB of which it kept."""
    rng = random.Random(4)
    words = text_of_length(rng, 1 << 20)
    texts = {"mixed": ((words * 8).encode()[: 4 << 20].decode(errors="ignore"), 256, True),
             "spaces then words": (" " * ((4 << 20) - 5000) + words[:5000], 256, True),
             "cjk": ("".join(rng.choice(CJK) for _ in range((4 << 20) // 3)), 256, True),
             "one giant word": ("x" * (4 << 20), 3, False)}
    with serving(ServerProcess(artifacts, "--max-request-bytes", str(8 << 20),
                               log_path=tmp_path / "server.log")) as server:
        with server.channel() as channel:
            stub = server.stub(channel)
            stub.Embed(make_request(["warm up"] * 8, truncate=True), timeout=60)
            # At rest after its first start's graph timing (engine/calibration.py, run once the server serves),
            # whose sessions would else grow the server while the texts are measured.
            wait_idle(server.process.pid, 2.0)
            before = memory_mb(server.process.pid)
            for name, (text, num_tokens, truncated) in texts.items():
                (reply,) = stub.Embed(make_request([text], truncate=True), timeout=60).embeddings
                assert (reply.num_tokens, reply.truncated) == (num_tokens, truncated)
                right_after = memory_mb(server.process.pid)
                after = settled_memory_mb(server.process.pid, before["VmRSS"] + SERVER_GROWTH_BOUND_MB)
                print(f"{name}: {len(text.encode()) / 2**20:.1f} MiB; server RSS {before['VmRSS']:.0f} MB before, "
                      f"{right_after['VmRSS']:.0f} MB right after, {after['VmRSS']:.0f} MB after the trims, "
                      f"peak {after['VmHWM']:.0f} MB")
                assert after["VmRSS"] <= before["VmRSS"] + SERVER_GROWTH_BOUND_MB
                assert after["VmHWM"] <= before["VmHWM"] + SERVER_PEAK_PER_REQUEST_BYTE * (4 << 20) / 2**20
