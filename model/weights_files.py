"""A checkpoint's weights as transformers saves them: model.safetensors, or the shards model.safetensors.index.json
lists (a model past the 5 GB transformers writes to one file: Qwen3-Embedding-4B's two shards), read one tensor
at a time.

Only safetensors is read: a pickle checkpoint can run code on load. Keys, shapes and dtypes come from the files'
headers, so a checkpoint is checked before any tensor is read; get() reads one tensor's bytes from its file straight
into the tensor's own memory. Not through a mapping (safetensors' safe_open): every page a mapping has read counts in
the process's resident memory until it is closed, so loading a model held its weights twice, the mapped file's and
the loaded copy (the Qwen3-Embedding-8B shape's 15 GB: 30 GB at the load's end, past a 24 GiB machine).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnserve.errors import CheckpointError

if TYPE_CHECKING:
    import torch

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
# safetensors' dtype names -> bytes per element, for the weights' size.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "F8_E4M3": 1, "F8_E5M2": 1}
# safetensors' dtype names -> torch's attribute names.
TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
                "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def has_weights(directory: Path) -> bool:
    return (directory / SINGLE).is_file() or (directory / INDEX).is_file()


class Weights:
    """The tensors of a checkpoint folder's safetensors file or shards, by key (names as saved)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._shard: dict[str, Path] = {}  # key -> its file
        if (directory / SINGLE).is_file():
            self.files = [directory / SINGLE]
            self.name = str(directory / SINGLE)
        elif (directory / INDEX).is_file():
            self.name = f"{directory / INDEX}'s shards"
            try:
                weight_map = json.loads((directory / INDEX).read_text(encoding="utf-8"))["weight_map"]
                self._shard = {str(key): directory / str(file) for key, file in weight_map.items()}
            except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise CheckpointError(f"{directory / INDEX} is unreadable: {type(e).__name__}: {e}") from None
            self.files = sorted(set(self._shard.values()))
            for file in self.files:
                if not file.is_file() or file.parent != directory:
                    raise CheckpointError(f"{directory / INDEX} names {file.name}, which is not a file in {directory}")
        else:
            raise CheckpointError(f"checkpoint file missing: {directory / SINGLE} (or {INDEX} with its shards)")
        # Each file's header, and where its tensors' bytes start (after the 8-byte length and the header).
        self._headers: dict[Path, dict[str, Any]] = {}
        self._data_start: dict[Path, int] = {}
        for file in self.files:
            self._headers[file], self._data_start[file] = _header(file)
        self._sizes = {file: file.stat().st_size for file in self.files}
        if not self._shard:
            self._shard = {key: self.files[0] for key in self._headers[self.files[0]]}
        for key, file in self._shard.items():
            if key not in self._headers[file]:
                raise CheckpointError(f"{self.name}: {file.name} lacks {key}, which the index places there")

    def keys(self) -> list[str]:
        return list(self._shard)

    def __contains__(self, key: str) -> bool:
        return key in self._shard

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._headers[self._shard[key]][key]["shape"])

    def dtype(self, key: str) -> str:
        """The tensor's dtype as stored, safetensors' name ("F32", "I64", ...)."""
        return str(self._headers[self._shard[key]][key]["dtype"])

    def nbytes(self) -> int:
        """The tensors' bytes as stored (the checkpoint's own dtypes)."""
        total = 0
        for key, file in self._shard.items():
            entry = self._headers[file][key]
            count = 1
            for dim in entry["shape"]:
                count *= dim
            total += count * DTYPE_BYTES.get(entry["dtype"], 4)
        return total

    def get(self, key: str) -> torch.Tensor:
        """One tensor, in its stored dtype, in memory of its own (read, not mapped: the module docstring)."""
        import torch

        file = self._shard[key]
        entry = self._headers[file][key]
        name = TORCH_DTYPES.get(entry["dtype"])
        if name is None:
            raise CheckpointError(f"{file}: {key} is stored as {entry['dtype']}, which no model here reads")
        shape = tuple(entry["shape"])
        offsets = entry.get("data_offsets")
        # Checked against the file before any memory is taken: a header may claim any shape.
        size = math.prod(shape) * DTYPE_BYTES[entry["dtype"]]
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and min(shape, default=0) >= 0 and 0 <= offsets[0] and offsets[1] - offsets[0] == size
                and self._data_start[file] + offsets[1] <= self._sizes[file]):
            raise CheckpointError(f"corrupt weights file {file}: {key}'s bytes {offsets!r} do not hold a "
                                  f"{entry['dtype']} tensor of shape {list(shape)} inside the file")
        tensor = torch.empty(shape, dtype=getattr(torch, name))
        start = self._data_start[file] + offsets[0]
        if size:
            view = tensor.view(-1).view(torch.uint8).numpy()  # the tensor's own bytes, read into in place
            try:
                with open(file, "rb", buffering=0) as f:
                    done = 0
                    while done < size:  # a read may return less than asked (a signal, a network disk)
                        got = os.preadv(f.fileno(), [view.data[done:]], start + done)
                        if got <= 0:
                            raise OSError(f"the file ended {size - done} bytes before {key}'s end")
                        done += got
            except OSError as e:
                raise CheckpointError(f"corrupt weights file {file}: {e}") from None
        return tensor


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's header: key -> {"dtype", "shape", "data_offsets"} (its __metadata__ left out), and the
    offset its tensors' bytes start at."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if size <= 0 or size > 100 * 2**20 or size > path.stat().st_size - 8:
                raise ValueError(f"header length {size} does not fit the file")
            header = json.loads(f.read(size))
        if not isinstance(header, dict):
            raise ValueError("the header is no JSON object")
        tensors = {key: value for key, value in header.items() if key != "__metadata__"}
        for key, entry in tensors.items():
            if not (isinstance(entry, dict) and isinstance(entry.get("dtype"), str)
                    and isinstance(entry.get("shape"), list) and all(isinstance(d, int) for d in entry["shape"])):
                raise ValueError(f"the header's entry for {key} is no tensor description")
        return tensors, 8 + size
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"corrupt weights file {path}: {e}") from None
