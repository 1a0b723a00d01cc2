"""Where `attnserve export` spends its time and memory: seconds per stage, total wall time and peak RSS.

Runs build_artifacts() (the code `attnserve export` runs) on a checkpoint folder and times each of its progress
steps (attnserve/progress.py: a step runs until the next one starts), then prints the stages, the total, the
CPU it ran on and the export's peak resident memory against the checkpoint's fp32 weights (issue 20's bound:
at most 3x). The export runs in a child process so that its peak RSS is its own, not the parent's; the resident
memory sampled is that process's and every process it starts (export runs onnxruntime's optimizer, quantizer and
fp16 converter in child processes of its own: export/isolated.py), summed.

    python bench/bench_export.py                                   # the default model (all-MiniLM-L6-v2)
    python bench/bench_export.py --checkpoint ~/.cache/attnserve/models/all-mpnet-base-v2
    python bench/bench_export.py --random bert-large               # a random-weight BERT-large (1.3 GB fp32)
    python bench/bench_export.py --external-data-above 0           # forces graphs with external data

On a shared machine the absolute seconds are inflated by the load; the shares are what compare.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

STEP = re.compile(r"^\[ *[\d.]+s\] (?P<what>.*)$")
HEARTBEAT = re.compile(r"^\[ *[\d.]+s\] \.\.\. still ")

# Random-weight checkpoints of real shapes: transformers BertConfig settings (BERT-large: 335M parameters).
RANDOM_SHAPES = {
    "bert-large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                       max_position_embeddings=512),
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                      max_position_embeddings=512),
}


def random_checkpoint(shape: str, directory: Path) -> Path:
    """A sentence-transformers folder: a random-weight BERT of the shape, all-MiniLM-L6-v2's tokenizer and mean
    pooling, saved by transformers itself."""
    import torch
    import transformers

    from attnserve.default_model import default_checkpoint_dir

    source = default_checkpoint_dir()
    config = transformers.BertConfig(vocab_size=30522, **RANDOM_SHAPES[shape])
    torch.manual_seed(0)
    transformers.BertModel(config, add_pooling_layer=False).save_pretrained(directory, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                 "modules.json", "sentence_bert_config.json"):
        if (source / name).is_file():
            (directory / name).write_bytes((source / name).read_bytes())
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_bytes((source / "1_Pooling" / "config.json").read_bytes())
    return directory


def _tree_rss(pid: int, page: int) -> int:
    """Resident bytes of the process and all its descendants (from /proc; a process gone meanwhile counts 0)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(parents.get(p, ()))
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * page
        except OSError:
            pass
    return total


def child(checkpoint: str, out: str, report: str) -> None:
    """The export itself, in this process: step lines with their times, then peak RSS, into the report file."""
    import resource

    # Every export module now, so that the code measured is the code as it was when the run started.
    from attnserve.export import int8_outliers, int8_recipes, int8_sensitivity  # noqa: F401
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint

    lines: list[tuple[float, str]] = []
    samples: list[tuple[float, int]] = []  # (time, resident bytes of the process tree), every 0.1 s
    done = threading.Event()

    def sample() -> None:
        page, pid = os.sysconf("SC_PAGE_SIZE"), os.getpid()
        while not done.wait(0.1):
            samples.append((time.monotonic(), _tree_rss(pid, page)))

    def log(line: str) -> None:
        lines.append((time.monotonic(), line))
        print(line, file=sys.stderr, flush=True)

    threading.Thread(target=sample, daemon=True).start()

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.monotonic()
    build_artifacts(read_checkpoint(Path(checkpoint), Path(checkpoint).name), Path(out), log=log)
    end = time.monotonic()
    done.set()
    Path(report).write_text(json.dumps({
        "start": start, "end": end, "lines": lines, "samples": samples, "rss_before_export": before,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        # The largest of the children's peaks (getrusage keeps no sum): this process's peak plus it bounds the
        # tree's peak from above where the 0.1 s samples could miss a child's spike.
        "children_peak_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
        "sampled_peak_rss": max((rss for _, rss in samples), default=0)}), encoding="utf-8")


def stages(lines: list[tuple[float, str]], samples: list[tuple[float, int]], end: float
           ) -> list[tuple[str, float, int]]:
    """(step, seconds, peak resident bytes sampled in it) in order: each step lasts until the next step line."""
    steps = [(t, STEP.match(line)["what"]) for t, line in lines if STEP.match(line) and not HEARTBEAT.match(line)]
    out = []
    for i, (t, what) in enumerate(steps):
        until = steps[i + 1][0] if i + 1 < len(steps) else end
        out.append((what, until - t, max((rss for at, rss in samples if t <= at < until), default=0)))
    return out


def fp32_weight_bytes(checkpoint: Path) -> int:
    """The checkpoint's parameters at 4 bytes each (what its fp32 graph holds)."""
    import math

    from safetensors import safe_open

    total = 0
    for path in checkpoint.rglob("*.safetensors"):
        with safe_open(str(path), "np") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) * 4 for name in f.keys())
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="checkpoint folder (default: all-MiniLM-L6-v2)")
    parser.add_argument("--random", choices=sorted(RANDOM_SHAPES), help="a random-weight checkpoint of this shape")
    parser.add_argument("--out", help="artifact directory to write (default: a temporary one, removed)")
    parser.add_argument("--external-data-above", type=int, default=None,
                        help="ATTNSERVE_EXTERNAL_DATA_ABOVE for the export (bytes of weights)")
    parser.add_argument("--json", help="also write the wall time, the peak and the weights' bytes to this file")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0

    from attnserve.engine.machine import this_machine

    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        if args.random:
            checkpoint = random_checkpoint(args.random, Path(tmp) / f"random-{args.random}")
        elif args.checkpoint:
            checkpoint = Path(args.checkpoint).expanduser()
        else:
            from attnserve.default_model import default_checkpoint_dir
            checkpoint = default_checkpoint_dir()
        out = Path(args.out) if args.out else Path(tmp) / "artifacts"
        report = Path(tmp) / "report.json"
        env = dict(os.environ)
        if args.external_data_above is not None:
            env["ATTNSERVE_EXTERNAL_DATA_ABOVE"] = str(args.external_data_above)
        wall = time.monotonic()
        subprocess.run([sys.executable, __file__, "--child", str(checkpoint), str(out), str(report)], check=True,
                       env=env)
        wall = time.monotonic() - wall
        result = json.loads(report.read_text(encoding="utf-8"))
        weights = fp32_weight_bytes(checkpoint)
        sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())} if out.is_dir() else {}

    total = result["end"] - result["start"]
    print(f"\ncheckpoint: {checkpoint.name}")
    print(f"machine: {this_machine().describe()}; load average {os.getloadavg()[0]:.2f} at the end")
    print(f"{'stage':86s} {'seconds':>8s} {'share':>6s} {'peak RSS':>9s}")
    for what, seconds, rss in stages(result["lines"], result["samples"], result["end"]):
        print(f"{what[:86]:86s} {seconds:8.1f} {seconds / total:6.1%} {rss / 2**30:7.2f}Gi")
    print(f"{'build_artifacts total':86s} {total:8.1f}")
    print(f"{'process wall time (imports, checkpoint read, export)':86s} {wall:8.1f}")
    peak = max(result["sampled_peak_rss"], result["peak_rss"])
    print(f"peak RSS {peak / 2**30:.2f} GiB, the export's processes together (before the export "
          f"{result['rss_before_export'] / 2**30:.2f} GiB); fp32 weights {weights / 2**30:.2f} GiB; peak / weights "
          f"{peak / weights:.2f}x")
    if result["children_peak_rss"]:
        bound = result["peak_rss"] + result["children_peak_rss"]
        print(f"  export process alone {result['peak_rss'] / 2**30:.2f} GiB, its largest child "
              f"{result['children_peak_rss'] / 2**30:.2f} GiB: at most {bound / 2**30:.2f} GiB together "
              f"({bound / weights:.2f}x) whatever the samples missed")
    print("files: " + ", ".join(f"{name} {size / 2**20:.1f} MiB" for name, size in sizes.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"wall_s": wall, "build_s": total, "peak_rss_bytes": peak,
                                               "fp32_weights_bytes": weights}), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
