"""jina-embeddings-v3's two ways to serve a task, timed side by side with onnxruntime on this CPU:
a graph with the task's LoRA merged into the weights (what export/task_graphs.py writes), and one graph with a
per-row `task` input that gathers each row's adapter (A, B) and adds x A^T B^T * scale to every Linear.

Random weights of a medium size (default hidden 512, 8 layers, rank 4, 5 tasks); prints ms per batch for both
and their ratio. Run: python bench/bench_jina_tasks.py [--hidden 512 --layers 8 --batch 8 --seq 128]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import torch.nn as nn

from attnserve.model.jina_v3 import JinaV3Config, JinaV3Encoder


class TaskLinear(nn.Module):
    """base(x) + scale * (x A_t^T) B_t^T with t each row's task: A (tasks, r, in), B (tasks, out, r)."""

    def __init__(self, base: nn.Linear, tasks: int, rank: int):
        super().__init__()
        self.base = base
        self.A = nn.Parameter(0.1 * torch.randn(tasks, rank, base.in_features))
        self.B = nn.Parameter(0.1 * torch.randn(tasks, base.out_features, rank))
        self.task: torch.Tensor | None = None  # (B,) int64, set per forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.task is not None
        A, B = self.A[self.task], self.B[self.task]  # (B, r, in), (B, out, r)
        return self.base(x) + torch.matmul(torch.matmul(x, A.transpose(1, 2)), B.transpose(1, 2))  # (B, T, out)


class TaskInputEncoder(nn.Module):
    def __init__(self, encoder: JinaV3Encoder, tasks: int, rank: int):
        super().__init__()
        self.encoder = encoder
        self.adapted = []
        for layer in encoder.layers:
            for owner, name in ((layer.attention, "qkv"), (layer.attention, "out"), (layer.feed_forward, "up"),
                                (layer.feed_forward, "down")):
                wrapped = TaskLinear(getattr(owner, name), tasks, rank)
                setattr(owner, name, wrapped)
                self.adapted.append(wrapped)

    def forward(self, input_ids, attention_mask, task):
        for module in self.adapted:
            module.task = task
        return self.encoder(input_ids, attention_mask)[0]


class Merged(nn.Module):
    def __init__(self, encoder: JinaV3Encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask):
        return self.encoder(input_ids, attention_mask)[0]


def timed(session: ort.InferenceSession, feed: dict, runs: int) -> float:
    session.run(None, feed)
    best = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feed)
        best.append(time.perf_counter() - start)
    return float(np.median(best)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    cfg = JinaV3Config(vocab_size=4000, hidden_size=args.hidden, num_layers=args.layers, num_heads=args.hidden // 64,
                       intermediate_size=4 * args.hidden, max_position_embeddings=1024)
    ids = torch.randint(5, cfg.vocab_size, (args.batch, args.seq))
    mask = torch.ones_like(ids)
    task = torch.arange(args.batch) % 5
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        merged_path, task_path = Path(folder) / "merged.onnx", Path(folder) / "task.onnx"
        axes = {"input_ids": {0: "b", 1: "t"}, "attention_mask": {0: "b", 1: "t"}}
        torch.onnx.export(Merged(JinaV3Encoder(cfg).eval()), (ids, mask), str(merged_path), dynamo=False,
                          opset_version=17, input_names=["input_ids", "attention_mask"], dynamic_axes=axes)
        torch.onnx.export(TaskInputEncoder(JinaV3Encoder(cfg).eval(), 5, 4), (ids, mask, task), str(task_path),
                          dynamo=False, opset_version=17, input_names=["input_ids", "attention_mask", "task"],
                          dynamic_axes={**axes, "task": {0: "b"}})
        feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        merged = timed(ort.InferenceSession(str(merged_path), options, providers=["CPUExecutionProvider"]), feed,
                       args.runs)
        with_input = timed(ort.InferenceSession(str(task_path), options, providers=["CPUExecutionProvider"]),
                           {**feed, "task": task.numpy()}, args.runs)
    print(f"hidden {args.hidden}, {args.layers} layers, batch {args.batch} x {args.seq} tokens, "
          f"{args.threads} thread(s): merged {merged:.1f} ms, task input {with_input:.1f} ms, "
          f"task input / merged {with_input / merged:.2f}")


if __name__ == "__main__":
    main()
