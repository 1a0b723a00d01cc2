"""A checkpoint's weights as transformers saves them: model.safetensors, or the shards model.safetensors.index.json
lists (a model past the 5 GB transformers writes to one file: Qwen3-Embedding-4B's two shards), read one tensor
at a time.

Only safetensors is read: a pickle checkpoint can run code on load. Keys, shapes and dtypes come from the files'
headers, so a checkpoint is checked before any tensor is read; get() reads one tensor from its file's mapping.
"""

from __future__ import annotations

import json
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
        self._headers: dict[Path, dict[str, Any]] = {file: _header(file) for file in self.files}
        if not self._shard:
            self._shard = {key: self.files[0] for key in self._headers[self.files[0]]}
        for key, file in self._shard.items():
            if key not in self._headers[file]:
                raise CheckpointError(f"{self.name}: {file.name} lacks {key}, which the index places there")
        self._open: dict[Path, Any] = {}

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
        """One tensor, in its stored dtype, in memory of its own."""
        from safetensors import SafetensorError, safe_open

        file = self._shard[key]
        try:
            if file not in self._open:
                self._open[file] = safe_open(str(file), framework="pt")
            return self._open[file].get_tensor(key)
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"corrupt weights file {file}: {e}") from None

    def close(self) -> None:
        self._open.clear()


def _header(path: Path) -> dict[str, Any]:
    """A safetensors file's header: key -> {"dtype", "shape", "data_offsets"} (its __metadata__ left out)."""
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
        return tensors
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"corrupt weights file {path}: {e}") from None
