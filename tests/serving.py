"""Where the tests get their real `attnserve serve` process: the helper the benchmarks use too.

It is defined in the package (attnserve/server_process.py), so that `python bench/bench_x.py` can import it
from any folder; the tests import it from here, as they always have. `serving` is the fixtures' one way to run
it: started and SERVING for the block, then stopped, and the stop must be clean (exit 0: a drain, no crash).
"""

import contextlib
from collections.abc import Iterator

from attnserve.server_process import ServerProcess, free_port

__all__ = ["ServerProcess", "free_port", "serving"]


@contextlib.contextmanager
def serving(process: ServerProcess) -> Iterator[ServerProcess]:
    try:
        process.wait_serving()
        yield process
    finally:
        assert process.terminate() == 0, process.log_tail()
