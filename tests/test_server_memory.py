"""After a burst of large attention replies, the server gives the memory back (server/memory.py)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from attnserve.client.client import make_request
from tests.serving import ServerProcess

# 16 concurrent requests of 8 inputs of 162 tokens, every layer's every head: 58 MiB per reply, the most
# that the default max_response_bytes (64 MiB) lets 8 such inputs have; 0.9 GiB of replies in all.
CLIENTS, INPUTS, WORDS = 16, 8, 160
LAYERS = list(range(6))
ALLOWED_GROWTH = 1.2


def status_mib(pid: int, field: str = "VmRSS") -> float:
    """A memory field of /proc/PID/status (VmRSS: resident now; VmHWM: the most it ever was), in MiB."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_rss_10_s_after_a_burst_of_large_attention_replies_is_back_near_where_it_was(artifacts, tmp_path):
    server = ServerProcess(artifacts, log_path=tmp_path / "server.log")
    try:
        server.wait_serving()
        pid = server.process.pid
        request = make_request([" ".join(["hello"] * WORDS)] * INPUTS, attention_layers=LAYERS)
        with server.channel() as channel:
            stub = server.stub(channel)
            stub.Embed(make_request(["one small request first"]), timeout=60)
            before = status_mib(pid)
            with ThreadPoolExecutor(CLIENTS) as pool:
                replies = list(pool.map(lambda _: stub.Embed(request, timeout=600), range(CLIENTS)))
            assert all(r.embeddings[0].num_tokens == WORDS + 2 for r in replies)
            reply_mib = replies[0].ByteSize() / 2**20
            del replies
            right_after, peak = status_mib(pid), status_mib(pid, "VmHWM")
            time.sleep(10)
            after = status_mib(pid)
        print(f"server RSS: {before:.0f} MiB before; {right_after:.0f} MiB right after {CLIENTS} replies of "
              f"{reply_mib:.1f} MiB (peak {peak:.0f}); {after:.0f} MiB 10 s later ({after / before:.2f}x)")
        assert after <= ALLOWED_GROWTH * before, (before, right_after, peak, after)
    finally:
        assert server.terminate() == 0, server.log_tail()
