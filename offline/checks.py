"""The bad-row rules that the reader cannot apply alone, and what becomes of a bad row.

The reader judges each row by itself (offline/readers.py). RowChecks adds what needs the
model or the rows before: token ids against the vocabulary, and ids seen before. A bad
row either stops the run with one line naming it (on_error "fail") or goes to the
skipped-rows file with its line and reason (on_error "skip"); never silently.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from attnserve.errors import InvalidInputError

from .image_readers import IMAGE_SUFFIXES, ImageFolder, open_input
from .partial import same_file
from .readers import Record

SKIP_HINT = " (--on-error skip sets such rows aside)"
# sentence-transformers' legacy Pooling config: a boolean per mode, by the names the manifest gives them (model/
# pipeline.py reads it whole; this is what late chunking needs of it, read without torch).
LEGACY_POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                        "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                        "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}


class RowChecks:
    """What the reader cannot know: token ids against the vocabulary, and ids seen before."""

    def __init__(self, vocab_size: int, track_ids: bool):
        """track_ids False: every id is its row number (.txt, Parquet without an id column): none can repeat."""
        self.vocab_size, self.track_ids = vocab_size, track_ids
        self.seen: set = set()

    def bad(self, records: list[Record]) -> list[tuple[Record, str]]:
        """Bad rows with their reasons. Run on every chunk, resumed ones too, so ids seen before are known."""
        return [(r, reason) for r in records if (reason := self.error(r))]

    def error(self, record: Record) -> str | None:
        if record.error:
            return record.error
        if record.token_ids is not None:
            if not record.token_ids:
                return "empty token id list"
            bad = [i for i in record.token_ids if not 0 <= i < self.vocab_size]
            if bad:
                return f"token id {bad[0]} is out of range [0, {self.vocab_size})"
        if self.track_ids:
            if record.id in self.seen:
                return f"duplicate id {record.id!r}"
            self.seen.add(record.id)
        return None


def bad_row_error(path: Path, where: str, reason: str) -> InvalidInputError:
    """on_error "fail": the one line that stops the run, naming the row ("line 12", "row 11")."""
    return InvalidInputError(f"{path}: {where}: {reason}{SKIP_HINT}")


def error_line(record: Record, reason: str) -> dict:
    """A row of the skipped-rows file: where, why, and the input as it was read (or as parsed). A folder's image
    is named by its path as well as its row (offline/image_readers.py); an image's input is its path, or its
    column's value described (never its bytes)."""
    where: dict = {"line": record.row + 1} if record.where == f"line {record.row + 1}" else {"row": record.row}
    if record.where not in (f"line {record.row + 1}", f"row {record.row}"):
        where["path"] = record.where
    return {**where, "reason": reason, "input": record.raw if record.raw is not None else _parsed(record)}


def where_of(line: dict) -> str:
    """The row an error_line names, as the one line that stops a run names it."""
    return line["path"] if "path" in line else f"line {line['line']}" if "line" in line else f"row {line['row']}"


def _parsed(record: Record) -> str:
    """A good row that a later check set aside kept no copy of its line: its fields, as JSON."""
    content = {"text": record.text} if record.text is not None else {"token_ids": record.token_ids}
    return json.dumps({"id": record.id, **content})


def check_before_loading(input_path: Path, output: Path, *, allow_empty: bool, text_column: str = "text",
                         id_column: str = "id", image_column: str | None = None) -> None:
    """A run's input and output, checked before the model loads (and, on a first run, before its export of
    minutes), so a mistake in either is one line within a second. Raises InvalidInputError.

    The input: a known suffix, a readable file, Parquet's columns (image_column: a column of images), or a folder
    of images; and at least one row unless allow_empty (then an empty input gives an empty Parquet file). The
    output: a .parquet name, not the input, in a folder that exists (never created: a mistyped folder is more often
    a mistake than a wish).
    """
    # suffix, exists, a regular file, readable, columns; or a folder, listed
    source = open_input(input_path, text_column, id_column, image_column)
    if not allow_empty and isinstance(source, ImageFolder) and source.is_empty():
        raise InvalidInputError(f"{input_path}: a folder with no image files in it ({', '.join(IMAGE_SUFFIXES)}); "
                                "encode reads a folder of images, or one .txt, .jsonl or .parquet file "
                                "(--allow-empty writes an empty Parquet file)")
    if not allow_empty and source.is_empty():
        raise InvalidInputError(f"{input_path}: empty input, nothing to encode (--allow-empty writes an empty "
                                "Parquet file)")
    if same_file(output, input_path):
        raise InvalidInputError(f"the output {output} is the input file {input_path}; write it elsewhere")
    if output.suffix.lower() != ".parquet":
        raise InvalidInputError(f"output {output}: encode writes Parquet; give a file name ending in .parquet")
    if output.is_dir():
        raise InvalidInputError(f"output {output} is a directory; give a .parquet file name")
    folder = output.parent
    if not folder.is_dir():
        raise InvalidInputError(f"cannot write output {output}: the folder {folder} "
                                f"{'is not a folder' if folder.exists() else 'does not exist'}")
    try:  # a file can be made there: permissions alone do not say so (root, read-only mounts, /proc)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise InvalidInputError(f"cannot write output {output}: no file can be made in the folder {folder} "
                                f"({e.strerror or type(e).__name__})") from None


def late_chunking_refusal(directory: Path) -> str | None:
    """Why `encode --late-chunking` cannot apply to the model in directory, read from its files before it loads
    (and before a checkpoint's export and a first start's calibration, which take a while): an artifact directory's
    manifest, a checkpoint's sentence-transformers modules. None where it may apply, or where the files do not say
    (the model is checked again once loaded: offline/job.py)."""
    if (directory / "manifest.json").is_file():
        from attnserve.engine.manifest import load_manifest

        manifest = load_manifest(directory, check_hashes=False)
        return None if manifest.late_chunkable else _not_pooled(manifest.model, " -> ".join(manifest.modules))
    try:
        return _checkpoint_refusal(directory)
    except (OSError, ValueError, TypeError, AttributeError, KeyError):  # malformed: the export says what is wrong
        return None


def _checkpoint_refusal(directory: Path) -> str | None:
    """A checkpoint's late-chunking refusal from its modules.json: a pooling of one mode (mean or CLS), then
    nothing but normalisation, as engine/manifest.py's late_chunkable asks of an exported one."""
    settings = directory / "config_sentence_transformers.json"
    model_type = json.loads(settings.read_text()).get("model_type") if settings.is_file() else None
    if model_type in ("SparseEncoder", "MultiVectorEncoder"):
        return _not_pooled(directory.name, f"a {model_type}")
    if not (directory / "modules.json").is_file():
        return None  # sentence-transformers' default: mean pooling
    modules = [(entry["type"].rsplit(".", 1)[-1], entry["path"])
               for entry in json.loads((directory / "modules.json").read_text())]
    names = [name for name, _ in modules]
    if "Pooling" not in names:
        return None
    at = names.index("Pooling")
    modes = _pooling_modes(json.loads((directory / modules[at][1] / "config.json").read_text()))
    if modes not in (["mean"], ["cls"]) or any(name != "Normalize" for name in names[at + 1:]):
        shown = [f"Pooling({'+'.join(modes)})" if name == "Pooling" else name for name in names]
        return _not_pooled(directory.name, " -> ".join(shown))
    return None


def _pooling_modes(config: dict) -> list[str]:
    """A Pooling config's modes: pooling_mode (sentence-transformers 6: a name or a list), else the legacy booleans."""
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        return [mode] if isinstance(mode, str) else [str(m) for m in mode]
    return [mode for key, mode in LEGACY_POOLING_MODES.items() if config.get(key)]


def _not_pooled(model: str, pipeline: str) -> str:
    return (f"--late-chunking mean-pools token embeddings, and {model}'s embedding is not a pooling of them (its "
            f"pipeline is {pipeline})")
