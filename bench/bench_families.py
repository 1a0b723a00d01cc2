"""Today's leading embedders at their real sizes: export time and memory, then `attnserve encode` against
sentence-transformers, fp32 and int8, each side on the same random-weight checkpoint (real_size_checkpoints.py).

For each shape, in one run:
  checkpoint  made once by real_size_checkpoints.py (transformers' classes, sentence-transformers' save) under
              --workdir, and reused by later runs;
  export      the real `attnserve export` in a subprocess: wall seconds and peak resident memory (the child's
              ru_maxrss), against the fp32 weights' bytes (the issue's bound: at most 3x);
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
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from real_size_checkpoints import SHAPES  # noqa: E402

EXPORT_MEMORY_BOUND = 3.0  # peak export memory / fp32 weights (issue 20)


def weights_bytes(checkpoint: Path) -> int:
    """The fp32 weights' bytes: every tensor in the checkpoint's safetensors files, at 4 bytes an element."""
    from safetensors import safe_open

    total = 0
    for file in checkpoint.rglob("*.safetensors"):
        with safe_open(str(file), framework="numpy") as f:
            for key in f.keys():
                n = 1
                for d in f.get_slice(key).get_shape():
                    n *= d
                total += 4 * n
    return total


def export(checkpoint: Path, out: Path) -> dict:
    """`attnserve export` in a child: wall seconds and peak RSS bytes (ru_maxrss is the largest child so far, so
    each export runs in a fresh `python -c` wrapper that reports its own child's)."""
    wrapper = ("import resource, subprocess, sys; "
               "rc = subprocess.call(sys.argv[1:]); "
               "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
               "sys.exit(rc)")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", wrapper, "attnserve", "export", "--checkpoint", str(checkpoint),
                           "--out", str(out)], capture_output=True, text=True)
    wall = time.perf_counter() - start
    sys.stderr.write(proc.stderr)
    if proc.returncode:
        raise SystemExit(f"attnserve export {checkpoint} failed ({proc.returncode})")
    peak = next(int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("peak_rss_kib"))
    return {"wall_s": wall, "peak_rss_bytes": peak * 1024}


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
        weights = weights_bytes(checkpoint)
        line = f"{shape}: fp32 weights {weights / 2**30:.2f} GiB"
        if args.reexport or not (artifacts / "manifest.json").is_file():
            result = export(checkpoint, artifacts)
            ratio = result["peak_rss_bytes"] / weights
            line += (f"; export {result['wall_s']:.0f} s, peak memory {result['peak_rss_bytes'] / 2**30:.2f} GiB = "
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
