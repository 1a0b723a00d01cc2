"""Fleet benchmark: what docker-compose.yml deploys, run without Docker, measured with `attnserve loadtest`.

Side by side in one run, on the mixed-length corpus, with the server settings
the compose file gives its `server` service (read from docker-compose.yml):

  one replica   one `attnserve serve` with the whole machine (onnxruntime's
                default threads), closed loop of --concurrency requests;
  two replicas  two `attnserve serve` processes with the compose settings
                (one onnxruntime thread each on the 2-core machine), reached
                the way compose's load test reaches them: client-side
                round_robin over every address of the target; the same closed
                loop. Its requests/s is the fleet's capacity. Both closed loops
                run without the compose file's queue-time bound, so that they
                measure computing, not refusing;
  open loop     a fresh fleet with every compose setting, at 0.8x and 2x that
                capacity: requests start on a fixed schedule whatever the
                replies, so queueing shows.

Every load is a real `attnserve loadtest --json -` subprocess. Each replica's
own Prometheus counters say how the load spread and that every request sent
was answered (nothing lost between client and servers).

The script measures; it exits 0 whether or not the targets are met.

    python bench/bench_fleet.py --artifacts /tmp/art              # about 4 minutes
    python bench/bench_fleet.py --duration 10 --warmup 2          # quicker, noisier
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

try:
    from bench_serve import BenchError, bench_main, log, scrape, start_server  # run as a script: bench/ on sys.path
    from report import target_line
except ImportError:
    from bench.bench_serve import BenchError, bench_main, log, scrape, start_server  # as `python -m bench.bench_fleet`
    from bench.report import target_line

from attnserve.server_process import ServerProcess

COMPOSE_FILE = Path(__file__).resolve().parent.parent / "docker-compose.yml"
TARGETS = {"fleet": (">=", 0.9, "0.9x"), "p99": ("<=", 3.0, "3x")}
START_TIMEOUT_S = 300.0


def compose_server_env(path: Path = COMPOSE_FILE) -> dict[str, str]:
    """The `server` service's ATTNSERVE_* environment, ${VAR:-default} taken as the shell would leave it."""
    import yaml

    service = yaml.safe_load(path.read_text())["services"]["server"]
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    expand = lambda value: re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}",
                                  lambda m: os.environ.get(m.group(1)) or (m.group(2) or ""), str(value))
    return {key: expand(value) for key, value in env.items() if key.startswith("ATTNSERVE_")}


def loadtest(target: str, *flags: str) -> dict:
    """One `attnserve loadtest` run; its JSON report plus the CPU seconds it used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "attnserve.cli", "loadtest", "--target", target, "--json", "-",
                           *flags], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise BenchError(f"attnserve loadtest {' '.join(flags)} exited {done.returncode}: {done.stderr.strip()}")
    report = json.loads(done.stdout)
    report["client_cpu_s"] = round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2)
    return report


def start_replicas(artifacts: Path, env: dict[str, str], count: int) -> list[ServerProcess]:
    replicas = [start_server(artifacts, env) for _ in range(count)]
    try:
        for replica in replicas:
            replica.wait_serving(timeout=START_TIMEOUT_S)
    except BaseException:
        for replica in replicas:
            replica.terminate()
        raise
    return replicas


def stop_replicas(replicas: list[ServerProcess]) -> None:
    codes = [replica.terminate() for replica in replicas]
    if any(code != 0 for code in codes):
        raise BenchError(f"replicas exited with {codes} after SIGTERM (expected 0)")


def answered(replicas: list[ServerProcess]) -> list[int]:
    """Embed requests each replica has answered so far, any status."""
    return [int(scrape(r).embed_requests) for r in replicas]


def measure(args, artifacts: Path, env: dict[str, str], count: int, loads: list[tuple[str, list[str]]]) -> dict:
    """Run each load against a fresh fleet of `count` replicas; per load its report and per-replica counts."""
    replicas = start_replicas(artifacts, env, count)
    results = {}
    try:
        target = "ipv4:" + ",".join(f"{r.host}:{r.port}" for r in replicas) if count > 1 else replicas[0].target
        for name, flags in loads:
            before = answered(replicas)
            log(f"{count} replica(s): {name}: attnserve loadtest {' '.join(flags)}")
            report = loadtest(target, "--warmup", str(args.warmup), "--duration", str(args.duration), *flags)
            report["per_replica"] = [b - a for a, b in zip(before, answered(replicas), strict=True)]
            results[name] = report
    finally:
        stop_replicas(replicas)
    return results


def check_nothing_lost(name: str, report: dict) -> None:
    """Every request the load test sent (warm-up included) was answered, and each replica counted its own."""
    sent = report["requests"]["sent"] + report["requests"]["warmup"]
    if report["requests"]["answered"] != report["requests"]["sent"] or sum(report["per_replica"]) != sent:
        raise BenchError(f"{name}: {sent} requests sent, {report['requests']['answered']} measured answers, "
                         f"replicas counted {report['per_replica']}")


def row(name: str, r: dict) -> str:
    lat, codes = r["latency_ms"], r["codes"]
    shed = codes.get("RESOURCE_EXHAUSTED", 0)
    other = sum(n for c, n in codes.items() if c not in ("OK", "RESOURCE_EXHAUSTED"))
    offered = f"{r['rate']:.1f}/s" if r["rate"] else f"{r['concurrency']} in flight"
    return (f"{name:<24} {offered:>13} {r['requests_per_s']:>8.1f} {r['tokens_per_s']:>9.0f} "
            f"{lat['p50']:>8.0f} {lat['p99']:>8.0f} {lat['max']:>8.0f} {shed:>6} {other:>6} "
            f"{r['requests']['retried']:>7}  "
            f"{'/'.join(map(str, r['per_replica']))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", help="artifact directory (default: the default model's, built on first use)")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds per load (default 20)")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each (default 3)")
    parser.add_argument("--concurrency", type=int, default=64, help="closed loop's requests in flight (default 64)")
    parser.add_argument("--set", action="append", default=[], metavar="ATTNSERVE_X=VALUE",
                        help="a server setting to try instead of the compose file's (repeatable)")
    parser.add_argument("--json", help="also write every number to this JSON file")
    args = parser.parse_args(argv)
    if any("=" not in item or not item.startswith("ATTNSERVE_") for item in args.set):
        parser.error("--set takes ATTNSERVE_NAME=VALUE")
    return bench_main("bench_fleet", run, args)  # a SIGTERM still stops the replicas


def run(args: argparse.Namespace) -> int:
    from attnserve.default_model import resolve_artifacts

    artifacts = resolve_artifacts(args.artifacts)
    fleet_env = compose_server_env() | dict(item.split("=", 1) for item in args.set)
    single_env = {k: v for k, v in fleet_env.items() if k != "ATTNSERVE_THREADS"}  # the whole machine
    closed = ["--concurrency", str(args.concurrency)]

    # Capacity is what the replicas compute, measured with no queue-time bound: with one, the closed
    # loop's streams would spend part of the run backing off from refusals instead of loading the server.
    unbounded = {"ATTNSERVE_MAX_QUEUE_WAIT_MS": "0"}
    one = measure(args, artifacts, single_env | unbounded, 1, [("closed", closed)])
    two = measure(args, artifacts, fleet_env | unbounded, 2, [("closed", closed)])
    capacity = two["closed"]["requests_per_s"]
    rate = lambda share: ["--rate", f"{capacity * share:.2f}"]
    two |= measure(args, artifacts, fleet_env, 2, [("open 0.8x", rate(0.8)), ("open 2x", rate(2.0))])
    runs = {"one replica, closed loop": one["closed"], "two replicas, closed loop": two["closed"],
            "two replicas, 0.8x capacity": two["open 0.8x"], "two replicas, 2x capacity": two["open 2x"]}
    for name, report in runs.items():
        check_nothing_lost(name, report)

    fleet_ratio = two["closed"]["tokens_per_s"] / one["closed"]["tokens_per_s"]
    p99_ratio = two["open 2x"]["latency_ms"]["p99"] / two["open 0.8x"]["latency_ms"]["p99"]
    shed = two["open 2x"]["codes"].get("RESOURCE_EXHAUSTED", 0)
    goodput = two["open 2x"]["requests_per_s"] / two["closed"]["requests_per_s"]
    print(f"attnserve fleet benchmark: {one['closed']['model']}; {two['closed']['input']}; "
          f"{args.duration:g} s per load after {args.warmup:g} s of warm-up")
    print(f"server settings from docker-compose.yml{' and --set' if args.set else ''}: "
          f"{' '.join(f'{k}={v}' for k, v in sorted(fleet_env.items()))} (one replica: default threads; "
          f"closed loops: ATTNSERVE_MAX_QUEUE_WAIT_MS=0)")
    print(f"two replicas reached as ipv4:A,B with lb_policy round_robin; cpu: {os.cpu_count()} logical cores\n")
    print(f"{'run':<24} {'offered':>13} {'ok req/s':>8} {'tokens/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8} {'shed':>6} {'other':>6} {'retried':>7}  per replica")
    for name, report in runs.items():
        print(row(name, report))
    print(f"\nat 2x: {shed} of {two['open 2x']['requests']['sent']} requests shed with RESOURCE_EXHAUSTED; "
          f"accepted throughput {goodput:.2f}x the fleet's closed-loop capacity")
    cpu = ", ".join(f"{r['client_cpu_s']} s" for r in runs.values())
    print(f"load test CPU: {cpu} over {args.warmup + args.duration:g} s each\n")
    lines = [target_line(TARGETS, "two replicas / one (tokens/s)", "fleet", fleet_ratio, f"{fleet_ratio:.2f}x"),
             target_line(TARGETS, "p99 at 2x / p99 at 0.8x", "p99", p99_ratio, f"{p99_ratio:.2f}x")]
    for line, _ in lines:
        print(line)
    print(f"{'sheds at 2x (RESOURCE_EXHAUSTED)':<30} {shed:>8}   target > 0      {'PASS' if shed else 'MISS'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "server_env": fleet_env,
                                               "targets": {"fleet": lines[0][1], "p99": lines[1][1],
                                                           "shed": shed}}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
