"""Today's leading embedders at their real sizes: export time and memory, then `attnserve encode` against
sentence-transformers, fp32 and int8, each side on the same random-weight checkpoint (real_size_checkpoints.py).

For each shape, in one run:
  checkpoint  made once by real_size_checkpoints.py (transformers' classes, sentence-transformers' save) under
              --workdir, and reused by later runs;
  export      bench_export.py: the export's stages, wall seconds and the peak resident memory of its process tree,
              against the fp32 weights' bytes (the issue's bound: at most 3x);
  encode      bench/bench_encode.py over the exported artifacts, with that checkpoint as sentence-transformers'
              model: fp32 tokens/s / sentence-transformers', int8 / fp32, and int8's cosine to fp32.
The machine's CPU kind and ceilings are printed by bench_encode. The script measures, it does not test.

    python bench/bench_families.py --workdir /tmp/families --texts 200
    python bench/bench_families.py --shapes qwen3-embedding-0.6b --skip-encode   # export time and memory only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from real_size_checkpoints import SHAPES  # noqa: E402

EXPORT_MEMORY_BOUND = 3.0  # peak export memory / fp32 weights (issue 20)


def export(checkpoint: Path, out: Path) -> dict:
    """bench_export.py's run of `attnserve export`: its stages are printed, and the wall seconds, the peak RSS of
    the export's whole process tree (sampled: onnxruntime's steps run in child processes) and the fp32 weights'
    bytes returned."""
    report = out.parent / "bench_export.json"
    subprocess.run([sys.executable, str(HERE / "bench_export.py"), "--checkpoint", str(checkpoint), "--out", str(out),
                    "--json", str(report)], check=True)
    return json.loads(report.read_text())


def encode(artifacts: Path, checkpoint: Path, texts: int, rounds: int, workdir: Path) -> dict:
    report = workdir / "bench_encode.json"
    subprocess.run([sys.executable, str(HERE / "bench_encode.py"), "--artifacts", str(artifacts), "--checkpoint",
                    str(checkpoint), "--texts", str(texts), "--rounds", str(rounds), "--skip-arrival",
                    "--workdir", str(workdir), "--json", str(report)], check=True)
    return json.loads(report.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/attnserve-families"))
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    parser.add_argument("--texts", type=int, default=200, help="corpus size for the encode runs (default 200)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--skip-encode", action="store_true", help="export time and memory only")
    parser.add_argument("--reexport", action="store_true", help="export again even where artifacts exist")
    args = parser.parse_args(argv)
    summary = []
    for shape in args.shapes:
        checkpoint, artifacts = args.workdir / shape / "checkpoint", args.workdir / shape / "artifacts"
        if not (checkpoint / "modules.json").is_file():
            print(f"[{shape}] making the random-weight checkpoint", file=sys.stderr, flush=True)
            SHAPES[shape](checkpoint)
        line = shape
        if args.reexport or not (artifacts / "manifest.json").is_file():
            result = export(checkpoint, artifacts)
            weights = result["fp32_weights_bytes"]
            ratio = result["peak_rss_bytes"] / weights
            line += (f": fp32 weights {weights / 2**30:.2f} GiB; export {result['wall_s']:.0f} s, peak memory "
                     f"{result['peak_rss_bytes'] / 2**30:.2f} GiB = "
                     f"{ratio:.2f}x the fp32 weights (target <= {EXPORT_MEMORY_BOUND:g}x: "
                     f"{'met' if ratio <= EXPORT_MEMORY_BOUND else 'MISSED'})")
        if not args.skip_encode:
            workdir = args.workdir / shape / "encode"
            workdir.mkdir(parents=True, exist_ok=True)
            report = encode(artifacts, checkpoint, args.texts, args.rounds, workdir)
            ratios, cosine = report["ratios"], report["cosine_int8_vs_fp32"]
            line += (f"; encode fp32 / sentence-transformers {ratios['fp32_vs_st']:.2f}x (target >= 1.5), "
                     f"int8 / fp32 {ratios['int8_vs_fp32']:.2f}x (target >= 1.8) at cosine mean "
                     f"{cosine['mean']:.4f} (target >= 0.995)")
        summary.append(line)
        print(line, flush=True)
    print("\n".join(["", "summary:", *summary]))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
