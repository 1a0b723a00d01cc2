"""What OpenVINO's compiled bf16 model of a half-precision graph holds: the graph as read against the graph read as
compressed weights (engine/openvino_session.py `_read`), each compiled in a process of its own.

    PYTHONPATH=<openvino's site> python bench/bench_openvino_memory.py ARTIFACTS/embeddings_half.onnx

Prints, for each: the process's own (anonymous) memory and its mapped files after compiling and after a first batch,
the compiled constants by element type, the seconds a batch of 8 x 64 tokens takes (mean of 3), and the cosine of
the two's sentence embeddings. Needs a CPU with native bf16 (AVX512-BF16 or AMX).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CHILD = r"""
import collections, json, sys, time
import numpy as np
import openvino as ov
from attnserve.engine import openvino_session

path, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]

def memory():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile")}

core = ov.Core()
from pathlib import Path
model = openvino_session._read(core, Path(path)) if mode == "compressed" else core.read_model(path)
compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "LATENCY",
                                             "NUM_STREAMS": "1"})
del model
after_compile = memory()
constants = collections.Counter()
for op in compiled.get_runtime_model().get_ordered_ops():
    shape = op.output(0).get_partial_shape()
    if op.get_rt_info()["layerType"].astype(str) == "Const" and shape.is_static:
        constants[op.output(0).get_element_type().get_type_name()] += int(np.prod(list(op.output(0).get_shape())))
rng = np.random.default_rng(0)
ids = rng.integers(100, 20000, size=(8, 64)).astype(np.int64)
mask = np.ones_like(ids)
mask[4:, 40:] = 0
request = compiled.create_infer_request()
feed = {port.get_any_name(): (ids if "ids" in port.get_any_name() else mask) for port in compiled.inputs}
request.infer(feed)
after_batch = memory()
started = time.perf_counter()
for _ in range(3):
    request.infer(feed)
seconds = (time.perf_counter() - started) / 3
sentence = next(o for o in compiled.outputs if any("sentence" in n or "pooling" in n for n in o.get_names()))
np.save(out, np.array(request.get_tensor(sentence).data, dtype=np.float32))
print(json.dumps({"after_compile": after_compile, "after_batch": after_batch, "constants": constants,
                  "seconds": seconds}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graph", type=Path, help="a half-precision trace (embeddings_half.onnx)")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("as read", "compressed"):
            out = Path(tmp) / f"{mode.replace(' ', '_')}.npy"
            child = subprocess.run([sys.executable, "-c", CHILD, str(args.graph), mode.split()[0], str(out)],
                                   capture_output=True, text=True, check=True)
            results[mode] = json.loads(child.stdout.strip().splitlines()[-1])
            results[mode]["embeddings"] = np.load(out)

    gb = 1e9
    print(f"{'':12} {'own after compile':>18} {'own after a batch':>18} {'mapped':>8} {'batch 8x64':>11}  constants")
    for mode, r in results.items():
        constants = ", ".join(f"{n / 1e6:.0f} M {t}" for t, n in sorted(r["constants"].items(), key=lambda kv: -kv[1])
                              if n >= 1e6)
        print(f"{mode:12} {r['after_compile']['RssAnon'] / gb:16.2f} GB {r['after_batch']['RssAnon'] / gb:16.2f} GB "
              f"{r['after_batch']['RssFile'] / gb:6.2f} GB {r['seconds'] * 1000:8.0f} ms  {constants}")
    a, b = (results[m]["embeddings"].astype(np.float64) for m in ("as read", "compressed"))
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    print(f"min cosine of the two's sentence embeddings: {cosine.min():.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
