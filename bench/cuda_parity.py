"""The exported graphs on onnxruntime's CUDA provider, held to the export's own bars against PyTorch.

Export verifies every graph on the CPU provider (export/verify.py). This runs the same check on CUDA: the same
PyTorch reference (the shape grid up to max_seq_length and the sample texts), the same metrics and the same
tolerances (fp32 max abs 1e-4, fp16 min cosine 0.999, the attention graph's maps too), for every graph onnxruntime
runs on CUDA: the fp32 graphs, the fp16 graph and the attention graph (int8 and bf16 are CPU graphs).

It needs a GPU and attnserve[gpu] (onnxruntime-gpu), and torch for the reference. Exits 1 if a graph misses its bar.

    python bench/cuda_parity.py --artifacts /tmp/art            # the default model's checkpoint
    python bench/cuda_parity.py --artifacts DIR --checkpoint CKPT
"""

from __future__ import annotations

import argparse
import sys
import time

CUDA_PRECISIONS = ("fp32", "fp16")  # int8's dynamic ops have CPU kernels only; bf16 runs on OpenVINO


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", required=True, help="the exported artifact directory")
    parser.add_argument("--checkpoint", help="the checkpoint it was exported from (default: the default model's)")
    parser.add_argument("--provider", default="cuda", choices=("cuda", "cpu"),
                        help="cuda (default); cpu repeats export's own verification, to check this script")
    args = parser.parse_args(argv)

    from attnserve.default_model import default_checkpoint_dir
    from attnserve.engine.manifest import load_manifest
    from attnserve.engine.session import ONNXRUNTIME, resolve_provider
    from attnserve.engine.tokenizer import TextTokenizer
    from attnserve.errors import AttnserveError
    from attnserve.export.verify import GraphCheck, Reference, check, measure_all
    from attnserve.model.checkpoint import load_encoder, read_checkpoint
    from attnserve.model.sentence_head import load_head

    try:
        provider = resolve_provider(args.provider)
        manifest = load_manifest(args.artifacts)
        ckpt = read_checkpoint(args.checkpoint or default_checkpoint_dir())
        tokenizer = TextTokenizer(manifest.path("tokenizer.json"), ckpt.max_seq_length, ckpt.config.vocab_size)
        start = time.perf_counter()
        reference = Reference(load_encoder(ckpt), load_head(ckpt.directory, ckpt.pipeline), ckpt.embedding_size,
                              tokenizer)
        # One check per file and optimizer set: two variants may name the same computation.
        checks: dict[str, GraphCheck] = {}
        for name, variant in manifest.variants.items():
            if variant.backend == ONNXRUNTIME and variant.precision in CUDA_PRECISIONS:
                checks[name] = GraphCheck(manifest.path(variant.file), variant.precision,
                                          variant.disabled_optimizers)
        metrics = measure_all(checks, reference, provider)
    except AttnserveError as e:
        print(f"cuda_parity: error: {e}", file=sys.stderr)
        return 1
    print(f"{manifest.model}: {len(checks)} graphs on {provider} against PyTorch "
          f"({time.perf_counter() - start:.1f} s)")
    failed = 0
    for name, graph in checks.items():
        m = metrics[name]
        shown = ", ".join(f"{k} {v:.7g}" if isinstance(v, float) else f"{k} {v}" for k, v in m.items())
        try:
            check(graph.path, graph.precision, m)
            verdict = "holds"
        except AttnserveError as e:
            verdict, failed = f"FAILS: {e}", failed + 1
        print(f"  {name} ({graph.precision}): {verdict}\n    {shown}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
