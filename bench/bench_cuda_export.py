"""A model too large for an fp32 copy, on a GPU (issue 33): the Qwen3-Embedding-8B shape (random weights, its real
config, bf16 as published) exported straight into fp16 (no fp32 copy held), verified and served on CUDA, against
sentence-transformers in fp32 on the same GPU.

    python bench/bench_cuda_export.py [--size 8b] [--work /tmp/big]

It needs a GPU, torch with CUDA and onnxruntime-gpu (docs/performance.md, "CUDA", says how it got onto the lent
machine). Prints each step's seconds, the export's peak RSS against the checkpoint's weights, the GPU memory
nvidia-smi saw, the server's cold start, and the cosine of the served embeddings to sentence-transformers'.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from bench_export import Sampler, free_port, weights_bytes  # noqa: E402


class GpuMemory:
    """The most GPU memory nvidia-smi reported in use, sampled every 0.2 s."""

    def __init__(self):
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.2):
            try:
                used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                      capture_output=True, text=True, timeout=5).stdout.split()
                self.peak = max(self.peak, int(used[0]) * 2**20)
            except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
                pass

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="8b", choices=("0.6b", "4b", "8b"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-cuda-export"))
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--provider", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run of the steps")
    args = parser.parse_args()
    from real_size_checkpoints import SHAPES

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    checkpoint, artifacts = args.work / "checkpoint", args.work / "artifacts"
    report: dict[str, object] = {"size": args.size}
    started = time.monotonic()
    SHAPES[f"qwen3-embedding-{args.size}"](checkpoint)
    report["checkpoint_seconds"] = round(time.monotonic() - started, 1)
    weights = weights_bytes(checkpoint)
    report["checkpoint_gib"] = round(weights / 2**30, 2)
    print(json.dumps(report), flush=True)

    env = {**os.environ, "ATTNSERVE_CACHE": str(args.work / "cache")}
    started = time.monotonic()
    gpu = GpuMemory()  # nvidia-smi's reading; 0 where there is none
    export = subprocess.Popen([sys.executable, "-m", "attnserve.cli", "export", "--checkpoint", str(checkpoint),
                               "--out", str(artifacts), "--precision", "fp16", "--provider", args.provider], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rss = Sampler(export.pid)
    assert export.stderr is not None
    for line in export.stderr:
        print(f"  export: {line.rstrip()[:160]}", flush=True)
    if export.wait() != 0:
        raise SystemExit("the export failed")
    report["export_seconds"] = round(time.monotonic() - started, 1)
    report["export_peak_rss_over_weights"] = round(rss.stop() / weights, 2)
    report["export_gpu_peak_gib"] = round(gpu.stop() / 2**30, 1)
    report["artifacts_over_weights"] = round(sum(p.stat().st_size for p in artifacts.rglob("*") if p.is_file())
                                             / weights, 2)
    manifest = json.loads((artifacts / "manifest.json").read_text())
    report["variants"] = {name: {k: v for k, v in variant["parity"].items() if "cosine" in k or "max_abs" in k}
                          for name, variant in manifest["variants"].items()}
    print(json.dumps(report), flush=True)

    texts = [line for line in (REPO / "export/data/sample_texts.txt").read_text().splitlines() if line.strip()]
    texts = texts[:args.texts]
    http = free_port()
    started = time.monotonic()
    server = subprocess.Popen([sys.executable, "-m", "attnserve.cli", "serve", "--artifacts", str(artifacts),
                               "--provider", args.provider, "--precision", "fp16", "--port", str(free_port()),
                               "--http-port", str(http), "--metrics-port", "-1"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while True:
            if server.poll() is not None:
                raise SystemExit(f"the server exited: {server.stderr.read()[-3000:]}")  # type: ignore[union-attr]
            try:
                reply = httpx.post(f"http://127.0.0.1:{http}/embed", json={"inputs": texts[:1]}, timeout=60)
                if reply.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        report["serve_cold_start_seconds"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        reply = httpx.post(f"http://127.0.0.1:{http}/embed", json={"inputs": texts}, timeout=600)
        report["serve_texts_seconds"] = round(time.monotonic() - started, 2)
        served = reply.json()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(120)
    print(json.dumps(report), flush=True)

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    started = time.monotonic()
    device = "cuda" if args.provider == "cuda" else "cpu"
    model = SentenceTransformer(str(checkpoint), device=device, model_kwargs={"torch_dtype": torch.float32})
    want = model.encode(texts, normalize_embeddings=True, batch_size=8)
    report["sentence_transformers_fp32_seconds"] = round(time.monotonic() - started, 1)
    got = np.array(served, dtype=np.float32)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    report["cosine_to_sentence_transformers_fp32"] = {"min": round(float(cosine.min()), 6),
                                                      "mean": round(float(cosine.mean()), 6)}
    print(json.dumps(report), flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, "bench_cuda_export.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
