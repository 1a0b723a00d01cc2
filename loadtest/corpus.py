"""A deterministic mixed-length corpus of real text, shared by the benchmarks.

Length mix (in words): 50% short (4-16), 35% medium (17-60), 15% long
(61-300, so some pass the 256-token limit and get truncated). Bucket counts
are fixed by largest remainder, so the split is exact for any N; lengths,
order and text are then drawn from numpy.random.default_rng(seed).

Each text is a contiguous window of words from export/data/sample_texts.txt
(its whitespace-split words as one pool, wrapping at the end), so the
vocabulary, scripts and punctuation are those of the committed real-text
sample rather than synthetic tokens.

    python -m attnserve.loadtest.corpus 2000 -o corpus.txt   # one text per line
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

SAMPLE_TEXTS = Path(__file__).resolve().parent.parent / "export/data/sample_texts.txt"

# (share of texts, fewest words, most words)
BUCKETS = ((0.50, 4, 16), (0.35, 17, 60), (0.15, 61, 300))


def bucket_counts(n_texts: int) -> list[int]:
    """Texts per bucket, summing to n_texts: floors, then the leftovers by largest remainder."""
    exact = [share * n_texts for share, _, _ in BUCKETS]
    counts = [int(x) for x in exact]
    # sorted() is stable: a tie goes to the earlier bucket, so the counts are the same on every run.
    by_remainder = sorted(range(len(BUCKETS)), key=lambda i: -(exact[i] - counts[i]))
    for i in by_remainder[: n_texts - sum(counts)]:
        counts[i] += 1
    return counts


def word_pool(path: Path = SAMPLE_TEXTS) -> list[str]:
    return path.read_text(encoding="utf-8").split()


def mixed_length_corpus(n_texts: int, seed: int = 0) -> list[str]:
    if n_texts < 0:
        raise ValueError(f"n_texts must be >= 0, got {n_texts}")
    pool = word_pool()
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([rng.integers(lo, hi + 1, size=count)
                              for count, (_, lo, hi) in zip(bucket_counts(n_texts), BUCKETS, strict=True)])
    lengths = rng.permutation(lengths)
    starts = rng.integers(0, len(pool), size=n_texts)
    doubled = pool + pool  # a window that runs off the end wraps to the start
    return [" ".join(doubled[s : s + n]) for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the benchmark corpus, one text per line.")
    parser.add_argument("n_texts", type=int, help="number of texts")
    parser.add_argument("-o", "--output", help="file to write (default: stdout)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    text = "".join(t + "\n" for t in mixed_length_corpus(args.n_texts, args.seed))
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
