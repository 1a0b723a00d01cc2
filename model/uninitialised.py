"""Building a module without initialising its weights, which a checkpoint's replace anyway: model/checkpoint.py
and model/clip.py load their models inside uninitialised_weights()."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

# torch.nn.init's in-place initialisers, which module constructors call on their fresh parameters.
INITIALISERS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
                "sparse_")


@contextlib.contextmanager
def uninitialised_weights() -> Iterator[None]:
    """Module constructors within leave their parameters as torch.empty allocated them: no random init of weights
    the checkpoint's replace anyway (seconds, and every page written, for a large model), as transformers'
    no_init_weights does. Buffers computed in a constructor are computed as ever."""
    saved = {name: getattr(torch.nn.init, name) for name in INITIALISERS}
    for name in INITIALISERS:
        setattr(torch.nn.init, name, _left_as_is)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(torch.nn.init, name, function)


def _left_as_is(tensor, *args, **kwargs):
    return tensor
