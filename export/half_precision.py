"""Exporting straight into fp16: the model held in half precision, its graph traced so, its reference in float32.

A run whose precision is fp16 (CUDA) or bf16 (OpenVINO) needs no fp32 graph, and a model of billions of parameters
cannot hold an fp32 copy at all on a 24 GiB machine (Qwen3-Embedding-4B: 16 GB in fp32, 8 GB in half precision).
Export then loads the weights straight into fp16 (model/checkpoint.py load_encoder), traces the module as it is
(its graph computes in fp16, as onnxruntime's fp16 converter would have made it, and gives float32 outputs), and
verifies it against PyTorch's outputs computed in float32 from those same weights: computed_in_fp32() makes each
submodule float32 while it runs and half again after, so that one submodule's weights are float32 at a time, not
the model's.

fp16, not bf16, for the weights and the graph: onnxruntime runs fp16 graphs on CUDA and verifies them on the CPU,
and OpenVINO compiles an fp16 graph in bf16 on a CPU with native bf16 (a cosine of 0.99998 to fp32 on MiniLM),
where it computed a bf16 ONNX graph wrongly (0.84). Rotary and position tables are float32 buffers, computed once
at full precision and cast to the activations' dtype as transformers casts them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn as nn

HALF = torch.float16


class Float32Outputs(nn.Module):
    """A module's outputs as float32: the graph traced from a half-precision module keeps the graphs' contract
    (float32 outputs; export/torch_to_onnx.py), with a Cast at each output as onnxruntime's converter adds."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.output_attentions = getattr(module, "output_attentions", False)
        self.encoder = getattr(module, "encoder", None)

    def forward(self, *args):
        out = self.module(*args)
        if isinstance(out, torch.Tensor):
            return out.float()
        return tuple(x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in out)


def _tensors(module: nn.Module) -> dict[tuple[nn.Module, str], torch.dtype]:
    """(owner, name) -> dtype of every floating parameter and buffer in module's tree."""
    out = {}
    for owner in module.modules():
        for name, t in (*owner._parameters.items(), *owner._buffers.items()):
            if t is not None and t.is_floating_point():
                out[(owner, name)] = t.dtype
    return out


def _cast(tensors: dict[tuple[nn.Module, str], torch.dtype], dtype: torch.dtype | None) -> None:
    """Each tensor as dtype (None: as the dict says), in place."""
    for (owner, name), own in tensors.items():
        target = own if dtype is None else dtype
        if name in owner._parameters:
            param = owner._parameters[name]
            if param is not None and param.dtype != target:
                param.data = param.data.to(target)
        else:
            buffer = owner._buffers[name]
            if buffer is not None and buffer.dtype != target:
                owner._buffers[name] = buffer.to(target)


@contextlib.contextmanager
def computed_in_fp32(*modules: nn.Module) -> Iterator[None]:
    """Forward passes within compute in float32, although the modules hold half-precision weights.

    Each layer (an element of an nn.ModuleList: the encoder's layers) is made float32 as it is called and is
    half again when it returns (forward hooks), so that one layer's weights are float32 at a time; what lies outside
    the layers (embeddings, final norms, heads, rotary tables, MPNet's shared position bias) is float32 throughout.
    A whole layer, not each of its parts: a layer reads its parts' weights without calling them (value norms read
    the output projection's). Afterwards every tensor has its dtype again."""
    layers = [layer for top in modules for m in top.modules() if isinstance(m, nn.ModuleList) for layer in m]
    inside = {id(m) for layer in layers for m in layer.modules()}
    outside = {key: dtype for top in modules for key, dtype in _tensors(top).items() if id(key[0]) not in inside}
    hooks = []
    for layer in layers:
        own = _tensors(layer)
        hooks.append(layer.register_forward_pre_hook(lambda m, args, own=own: _cast(own, torch.float32)))
        hooks.append(layer.register_forward_hook(lambda m, args, out, own=own: _cast(own, None)))
    _cast(outside, torch.float32)
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
        _cast(outside, None)
