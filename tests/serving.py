"""Where the tests get their real `attnserve serve` process: the helper the benchmarks use too.

It is defined in the package (attnserve/server_process.py), so that `python bench/bench_x.py` can import it
from any folder; the tests import it from here, as they always have.
"""

from attnserve.server_process import ServerProcess, free_port

__all__ = ["ServerProcess", "free_port"]
