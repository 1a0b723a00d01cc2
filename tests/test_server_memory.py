"""After a burst of large attention replies, the server gives the memory back (server/memory.py), also when the
client takes the replies only seconds after the server built them (a slow or busy client)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from attnserve.client.client import make_request
from attnserve.server.memory import TRIM_DELAYS
from tests.serving import ServerProcess, serving

# 16 concurrent requests of 8 inputs of 162 tokens, every layer's every head: 58 MiB a reply, the most the default
# max_response_bytes (64 MiB) lets 8 such inputs have; 0.9 GiB of replies in all.
CLIENTS, INPUTS, WORDS = 16, 8, 160
# How much of the burst's memory (the most RssAnon held during it less the server's at rest before it, both measured
# in this run) may still be held once the replies are sent and the trims have run. Without the trims the server stays
# near its peak (the whole of it held); with them, a CI run kept 0.087 of it (allocator fragments). That run failed
# the bound this replaced, a fixed ratio to the resting size (1.46x against 1.2x), which a quiet machine met by a few
# percent; a share of the burst measured in the same run does not depend on how large the server was at rest.
ALLOWED_LEFT = 0.25
# The client is stopped from when its requests are sent until the server has built every reply and been idle this
# long (past the first trim, the replies unsent), but never longer than STOPPED_AT_MOST_S: grpc ends a connection
# whose peer leaves a ping unanswered for its keepalive timeout (20 s; grpc#34640).
STOPPED_AFTER_IDLE_S, STOPPED_AT_MOST_S = 2.5, 12.0

BURST = textwrap.dedent(f"""
    import sys
    from concurrent.futures import ThreadPoolExecutor
    import grpc
    from attnserve.client.client import CHANNEL_OPTIONS, make_request
    from attnserve.v1 import encoder_pb2_grpc
    request = make_request([" ".join(["hello"] * {WORDS})] * {INPUTS}, attention_layers=list(range(6)))
    with grpc.insecure_channel(sys.argv[1], options=CHANNEL_OPTIONS) as channel:
        stub = encoder_pb2_grpc.EncoderStub(channel)
        with ThreadPoolExecutor({CLIENTS}) as pool:
            replies = list(pool.map(lambda _: stub.Embed(request, timeout=600), range({CLIENTS})))
    assert all(r.embeddings[0].num_tokens == {WORDS + 2} for r in replies)
    print(f"{{replies[0].ByteSize() / 2**20:.1f}}")
""")


def status_mib(pid: int, field: str) -> float:
    """A field of /proc/PID/status in MiB. RssAnon: the process's own memory resident now (VmRSS less the files it
    maps, which the page cache shares); VmHWM: the most VmRSS ever was."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def cpu_seconds(pid: int) -> float:
    utime, stime = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[11:13]
    return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


def wait_idle(pid: int, seconds: float, timeout: float = 300, at_most: float | None = None) -> None:
    """Until the process has used no CPU (under 2%) for `seconds`, or at_most seconds have passed (where given)."""
    started = time.monotonic()
    give_up, last, quiet_since = started + timeout, cpu_seconds(pid), started
    while time.monotonic() - quiet_since < seconds:
        if at_most is not None and time.monotonic() - started >= at_most:
            return
        assert time.monotonic() < give_up, "the server never went idle"
        time.sleep(0.25)
        now = cpu_seconds(pid)
        if now - last > 0.005:
            quiet_since = time.monotonic()
        last = now


def test_rss_after_a_burst_of_large_attention_replies_taken_late_is_back_near_where_it_was(artifacts, tmp_path):
    with serving(ServerProcess(artifacts, log_path=tmp_path / "server.log")) as server:
        pid = server.process.pid
        # The baseline is the server at rest after its first start's graph timing (engine/calibration.py) and a
        # first request for maps (the attention session, over 100 MiB for as long as the server runs), so that
        # what is measured is the replies' memory.
        with server.channel() as channel:
            server.stub(channel).Embed(make_request(["one small request first"], attention_layers=list(range(6))),
                                       timeout=60)
        wait_idle(pid, STOPPED_AFTER_IDLE_S)
        before = status_mib(pid, "RssAnon")
        client = subprocess.Popen([sys.executable, "-c", BURST, server.target], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        start, give_up = cpu_seconds(pid), time.monotonic() + 120
        while cpu_seconds(pid) - start < 1.0:  # until the server is busy with the burst: its requests are in
            assert time.monotonic() < give_up, "the burst never reached the server"
            time.sleep(0.05)
        client.send_signal(signal.SIGSTOP)
        wait_idle(pid, STOPPED_AFTER_IDLE_S, at_most=STOPPED_AT_MOST_S)
        held = status_mib(pid, "RssAnon")
        client.send_signal(signal.SIGCONT)
        out, err = client.communicate(timeout=600)
        assert client.returncode == 0, err[-3000:]
        right_after, peak, done = status_mib(pid, "RssAnon"), status_mib(pid, "VmHWM"), time.monotonic()
        after = right_after
        # Polled until past the server's last trim (TRIM_DELAYS idle); a fixed 10 s let a busy machine decide.
        burst = max(held, right_after) - before
        allowed = before + ALLOWED_LEFT * burst
        while after > allowed and time.monotonic() - done < sum(TRIM_DELAYS) + 5:
            time.sleep(0.5)
            after = status_mib(pid, "RssAnon")
        print(f"server RssAnon: {before:.0f} MiB before; {held:.0f} MiB with {CLIENTS} replies of {out.strip()} MiB "
              f"built and unsent; {right_after:.0f} MiB once sent (VmRSS peak {peak:.0f}); {after:.0f} MiB "
              f"{time.monotonic() - done:.1f} s later ({(after - before) / burst:.3f} of the burst left)")
        # The burst must have been a burst for the bound to mean anything: its replies alone are 0.9 GiB.
        assert burst > 500, (before, held, right_after)
        assert after <= allowed, (before, held, right_after, peak, after)
