"""`attnserve encode` checks its input and output before it loads the model: a mistake is one line at once, not
after the model loads (or, on a first run, after an export of minutes into the cache)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from .conftest import assert_one_line_error, run_cli


def _prepare(tmp_path, case: str):
    """(input, output, expected fragment) of one mistake."""
    good = tmp_path / "in.txt"
    good.write_text("hello\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "folder.txt").mkdir()
    (tmp_path / "in.csv").write_text("a,b\n")
    (tmp_path / "out.parquet").mkdir()
    (tmp_path / "a-file").write_text("")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    no_folder = tmp_path / "no" / "such"
    return {
        "missing input": (tmp_path / "nope.txt", tmp_path / "o.parquet", "nope.txt: no such file"),
        "a directory as input": (tmp_path / "folder.txt", tmp_path / "o.parquet", "a directory, not a regular file"),
        # any other folder is one of images (tests/test_offline_images.py): one with none is a mistake, said at once
        "a directory without a suffix": (tmp_path, tmp_path / "o.parquet", "a folder with no image files in it"),
        "unknown input suffix": (tmp_path / "in.csv", tmp_path / "o.parquet", "unknown input format '.csv'"),
        "unreadable parquet": (tmp_path / "bad.parquet", tmp_path / "o.parquet", "not a readable Parquet file"),
        "empty input": (tmp_path / "empty.txt", tmp_path / "o.parquet", "empty input, nothing to encode"),
        "empty parquet input": (tmp_path / "empty.parquet", tmp_path / "o.parquet", "empty.parquet: empty input"),
        "missing output folder": (good, no_folder / "o.parquet",
                                  f"cannot write output {no_folder / 'o.parquet'}: the folder {no_folder} does not"),
        "output folder a file": (good, tmp_path / "a-file" / "o.parquet",
                                 f"the folder {tmp_path / 'a-file'} is not a folder"),
        "output not parquet": (good, tmp_path / "o.csv", "give a file name ending in .parquet"),
        "output a directory": (good, tmp_path / "out.parquet", "is a directory; give a .parquet file name"),
        # a folder no file can be made in, whoever runs the tests (root included): /proc takes no new files
        "output folder not writable": (good, Path("/proc/o.parquet"), "no file can be made in the folder /proc"),
    }[case]


CASES = ["missing input", "a directory as input", "a directory without a suffix", "unknown input suffix",
         "unreadable parquet", "empty input", "empty parquet input", "missing output folder", "output folder a file",
         "output not parquet", "output a directory", "output folder not writable"]


@pytest.mark.parametrize("case", CASES)
def test_a_bad_input_or_output_is_refused_before_the_model_loads(tmp_path, case):
    """With an empty cache and no --artifacts, loading the model would export it first: the cache stays empty."""
    source, output, fragment = _prepare(tmp_path, case)
    cache = tmp_path / "cache"
    result = run_cli("encode", source, "-o", output, "--no-progress", env={"ATTNSERVE_CACHE": str(cache)})
    assert_one_line_error(result, fragment)
    assert "--allow-empty" in result.stderr or case != "empty input"
    assert not cache.exists() or not any(cache.iterdir()), "the model was loaded (exported) before the check"
    assert not (tmp_path / "no").exists(), "the output's folder was created"


@pytest.mark.parametrize("name", ["empty.txt", "empty.jsonl"])
def test_allow_empty_writes_an_empty_parquet_file(artifacts, tmp_path, name):
    (tmp_path / name).write_text("")
    result = run_cli("encode", tmp_path / name, "-o", tmp_path / "o.parquet", "--artifacts", artifacts,
                     "--allow-empty", "--no-progress")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("encoded 0 texts, 0 tokens")
    table = pq.read_table(tmp_path / "o.parquet")
    assert table.num_rows == 0 and table.column_names == ["id", "embedding", "num_tokens", "truncated"]
