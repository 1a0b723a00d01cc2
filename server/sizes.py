"""Sizes as people read them, in the messages of the limits on request bytes."""


def human_size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"
