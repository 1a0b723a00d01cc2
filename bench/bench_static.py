"""Static embeddings: attnserve's offline encode against model2vec's own StaticModel.encode, tokens/s side by side.

The model is potion-base-8M's shape: BERT's uncased WordPiece vocabulary (the default checkpoint's tokenizer.json,
30,522 tokens, as bge-base-en-v1.5's that potion-base-8M distils), 256 dimensions, random vectors, max_length 512,
normalize true, saved by model2vec's own save_pretrained and exported by attnserve. The texts are the mixed-length
corpus (loadtest/corpus.py). Both sides count the same tokens: each text's ids after model2vec's character cut and
max_length, [UNK] dropped (the engine's num_tokens, which the conformance test holds equal to model2vec's). Timed:
Engine.encode (what `attnserve encode`'s local chunk encoder calls: tokenizing, batching, the graph, pooling,
normalising) and StaticModel.encode (tokenizing, the lookup and mean, normalising), each best of --rounds after a
warm-up, alternating. Prints the CPU, both tokens/s and the ratio (target: at least 1x). It measures; it exits 0.

    python bench/bench_static.py [--texts 20000] [--rounds 3] [--max-batch-tokens N] [--max-batch-size N]

--max-batch-tokens and --max-batch-size are `attnserve encode`'s (EngineConfig's defaults unless given): a static
model's batches cost no attention, so budgets past the transformers' 2,048 padded tokens pay fewer runs' overhead.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def model2vec_encode(model, texts: list[str]) -> np.ndarray:
    """StaticModel.encode, leaving the process's tokenizers as it found them: past its multiprocessing_threshold
    (10,000 texts) model2vec sets TOKENIZERS_PARALLELISM=false for the whole process and leaves it so, which would
    make every later tokenizing in this process (attnserve's rounds) single-threaded."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    try:
        return model.encode(texts)
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-batch-tokens", type=int, default=None)
    parser.add_argument("--max-batch-size", type=int, default=None)
    args = parser.parse_args()

    from model2vec import StaticModel
    from tokenizers import Tokenizer

    from attnserve.config import EngineConfig
    from attnserve.default_model import default_checkpoint_dir
    from attnserve.engine.engine import Engine
    from attnserve.engine.machine import this_machine
    from attnserve.export.artifacts import build_artifacts
    from attnserve.loadtest.corpus import mixed_length_corpus
    from attnserve.model.checkpoint import read_checkpoint

    print(f"machine: {this_machine().describe()}")
    texts = mixed_length_corpus(args.texts)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = Tokenizer.from_file(str(default_checkpoint_dir() / "tokenizer.json"))
        vectors = np.random.default_rng(0).standard_normal((tokenizer.get_vocab_size(), 256)).astype(np.float32)
        StaticModel(vectors, tokenizer, normalize=True, max_length=512).save_pretrained(Path(tmp) / "model")
        build_artifacts(read_checkpoint(Path(tmp) / "model"), Path(tmp) / "artifacts", log=lambda line: None,
                        variants=["embeddings"])
        config = EngineConfig(**{key: value for key, value in (("max_batch_tokens", args.max_batch_tokens),
                                                               ("max_batch_size", args.max_batch_size)) if value})
        engine = Engine.from_directory(Path(tmp) / "artifacts", config)
        model = StaticModel.from_pretrained(Path(tmp) / "model")
        tokens = int(engine.encode(texts).num_tokens.sum())
        ours = engine.encode(texts[:256]).embeddings
        assert np.abs(ours - model2vec_encode(model, texts[:256])).max() <= 1e-6  # the same answers are being timed
        best = {"attnserve": float("inf"), "model2vec": float("inf")}
        for round_ in range(args.rounds):
            runs = [("attnserve", lambda: engine.encode(texts)), ("model2vec", lambda: model2vec_encode(model, texts))]
            for name, run in runs if round_ % 2 == 0 else runs[::-1]:
                start = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - start)
    print(f"{len(texts)} texts, {tokens} tokens (after model2vec's cut, [UNK] dropped), best of {args.rounds}; "
          f"attnserve's batches: max_batch_tokens {engine.config.max_batch_tokens}, "
          f"max_batch_size {config.max_batch_size}")
    for name, seconds in best.items():
        print(f"{name:>10}: {tokens / seconds:>12,.0f} tokens/s ({seconds:.2f} s)")
    print(f"ratio attnserve / model2vec: {best['model2vec'] / best['attnserve']:.2f}x (target >= 1x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
