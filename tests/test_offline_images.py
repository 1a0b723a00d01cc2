"""`attnserve encode` of images (a folder, or a Parquet column of their bytes or paths) through the tiny CLIP, each
embedding held to transformers' CLIPModel.get_image_features (cosine >= 0.99999). A bad image is a bad row, as a bad
text is; a resumed run ends with the bytes of one never stopped; a server and Ray give the same rows."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from attnserve.config import EngineConfig
from attnserve.engine.engine import Engine, embeddings_graph
from attnserve.engine.manifest import load_manifest
from attnserve.offline import image_readers
from attnserve.offline.encode import encode_file, read_embeddings
from attnserve.offline.image_readers import ImageColumn, ImageFolder
from attnserve.offline.job import EncodeJob

from .conftest import assert_one_line_error, run_cli
from .offline_helpers import encoded, errors_of, interrupted_run, text_file

POSITIONS = 17  # the tiny CLIP's tower: (32 / 8)^2 patches and the class token
CAPTIONS = ["a photo of the cat", "the dog"]
CORRUPTED = "the image is corrupt or truncated (PNG)"


def picture(seed: int, size: tuple[int, int], mode: str, fmt: str) -> bytes:
    """Random pixels of `mode` saved as `fmt`."""
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4}.get(mode)
    shape = (size[1], size[0], channels) if channels else (size[1], size[0])
    buffer = io.BytesIO()
    Image.fromarray((rng.random(shape) * 255).astype(np.uint8), mode).save(buffer, fmt)
    return buffer.getvalue()


# Relative path -> bytes: modes, sizes and formats of several kinds, and a nested folder; in path order.
IMAGES = {
    "B.JPG": picture(1, (33, 64), "RGB", "JPEG"),
    "a.png": picture(0, (50, 40), "RGB", "PNG"),
    "nested/c.webp": picture(2, (64, 48), "L", "WEBP"),
    "nested/d.PNG": picture(3, (40, 40), "RGBA", "PNG"),
    "nested/e.gif": picture(4, (36, 30), "P", "GIF"),
}
CORRUPT = "b-corrupt.png"  # a PNG cut short: sorts between a.png and nested/


@pytest.fixture
def photos(tmp_path) -> Path:
    """A folder of IMAGES, the corrupt one, and files that are not images (left out)."""
    folder = tmp_path / "photos"
    for name, data in IMAGES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    (folder / CORRUPT).write_bytes(IMAGES["a.png"][:60])
    (folder / "notes.txt").write_text("not an image\n")
    (folder / "nested" / "image.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
    return folder


@pytest.fixture(scope="module")
def reference(clip_dir) -> dict[str, np.ndarray]:
    """transformers' own image features of each of IMAGES (by name), and its text features of CAPTIONS."""
    import torch
    import transformers

    model = transformers.CLIPModel.from_pretrained(str(clip_dir)).eval()
    processor = transformers.CLIPProcessor.from_pretrained(str(clip_dir))
    pictures = [Image.open(io.BytesIO(data)) for data in IMAGES.values()]
    with torch.no_grad():
        images = model.get_image_features(**processor(images=pictures, return_tensors="pt"))
        texts = model.get_text_features(**processor(text=CAPTIONS, return_tensors="pt", padding=True))
    images, texts = (getattr(x, "pooler_output", x) for x in (images, texts))  # a tensor, or an output holding it
    return {**dict(zip(IMAGES, images.numpy(), strict=True)), "captions": texts.numpy()}


@pytest.fixture(scope="module")
def clip_engine(clip_artifacts):
    return Engine.from_directory(clip_artifacts, EngineConfig())


def assert_same_as_transformers(path: Path, want) -> None:
    got, want = (np.asarray(x, dtype=np.float64) for x in (read_embeddings(path), want))
    cosines = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cosines.min() >= 0.99999, cosines


def test_a_folder_is_encoded_in_path_order_as_transformers_does_the_corrupt_image_set_aside(
        clip_artifacts, photos, reference, tmp_path):
    out = tmp_path / "out.parquet"
    result = encoded(photos, out, "--artifacts", clip_artifacts, "--on-error", "skip", "--normalize")
    assert f"encoded 5 images, {5 * POSITIONS} tokens" in result.stdout
    assert f"skipped 1 bad rows -> {tmp_path / 'out.errors.jsonl'}" in result.stdout
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == list(IMAGES)  # nested, any case of suffix; text and SVG files left out
    assert table.column("num_tokens").to_pylist() == [POSITIONS] * 5
    assert table.column("truncated").to_pylist() == [False] * 5
    assert_same_as_transformers(out, [reference[n] for n in IMAGES])
    assert np.allclose(np.linalg.norm(read_embeddings(out), axis=-1), 1.0, atol=1e-6)  # --normalize
    assert errors_of(tmp_path / "out.errors.jsonl") == [
        {"row": 2, "path": CORRUPT, "input": CORRUPT, "reason": f"{CORRUPTED}: image file is truncated"}]
    metadata = json.loads(table.schema.metadata[b"attnserve"])
    assert metadata["inputs"] == "images" and metadata["pooling"] == "image_tower"
    assert metadata["normalize"] is True and metadata["max_image_pixels"] == 25_000_000
    assert_one_line_error(run_cli("encode", photos, "-o", tmp_path / "stopped.parquet", "--artifacts", clip_artifacts),
                          f"{photos}: {CORRUPT}: {CORRUPTED}", "--on-error skip sets such rows aside")
    assert not (tmp_path / "stopped.parquet").exists()


def test_parquet_columns_of_bytes_and_of_paths_give_the_folders_rows(clip_artifacts, photos, reference, tmp_path):
    names = list(IMAGES)
    pq.write_table(pa.table({"picture": [IMAGES[n] for n in names] + [b"<svg/>", None],
                             "id": [f"img-{i}" for i in range(len(names) + 2)]}), tmp_path / "bytes.parquet",
                   row_group_size=2)
    paths = [f"photos/{n}" for n in names[:-1]] + [str(photos / names[-1]), "photos/missing.png", ""]
    pq.write_table(pa.table({"file": paths}), tmp_path / "paths.parquet")
    flags = ("--artifacts", clip_artifacts, "--on-error", "skip")
    encoded(tmp_path / "bytes.parquet", tmp_path / "bytes-out.parquet", *flags, "--image-column", "picture",
            "--chunk-rows", "3")
    table = pq.read_table(tmp_path / "bytes-out.parquet")
    assert table.column("id").to_pylist() == [f"img-{i}" for i in range(len(names))]
    assert_same_as_transformers(tmp_path / "bytes-out.parquet", [reference[n] for n in names])
    assert [(e["row"], e["reason"].split(":")[0], e["input"]) for e in errors_of(tmp_path / "bytes-out.errors.jsonl")
            ] == [(5, "SVG and other XML images are refused", json.dumps({"picture": "6 bytes", "id": "img-5"})),
                  (6, "missing image (null)", json.dumps({"picture": None, "id": "img-6"}))]
    encoded(tmp_path / "paths.parquet", tmp_path / "paths-out.parquet", *flags, "--image-column", "file")
    assert pq.read_table(tmp_path / "paths-out.parquet").column("id").to_pylist() == list(range(len(names)))
    assert_same_as_transformers(tmp_path / "paths-out.parquet", [reference[n] for n in names])
    assert [(e["row"], e["reason"]) for e in errors_of(tmp_path / "paths-out.errors.jsonl")] == [
        (5, "photos/missing.png: cannot read the file: No such file or directory"), (6, "empty path")]
    # A path row's failure stops a run that does not skip, naming the row and the path
    assert_one_line_error(run_cli("encode", tmp_path / "paths.parquet", "-o", tmp_path / "fail.parquet",
                                  "--artifacts", clip_artifacts, "--image-column", "file"),
                          "paths.parquet: row 5: photos/missing.png: cannot read the file")


def test_an_image_over_the_pixel_limit_is_a_bad_row(clip_artifacts, photos, tmp_path):
    out = tmp_path / "out.parquet"
    encoded(photos, out, "--artifacts", clip_artifacts, "--on-error", "skip", "--max-image-pixels", "2500")
    errors = {e["path"]: e["reason"] for e in errors_of(tmp_path / "out.errors.jsonl")}
    assert errors["nested/c.webp"] == "the image is 64 x 48 = 3,072 pixels, over the limit of 2,500"
    assert sorted(errors) == [CORRUPT, "nested/c.webp"]  # B.JPG's 33 x 64 = 2,112 is within it
    assert pq.read_table(out).column("id").to_pylist() == ["B.JPG", "a.png", "nested/d.PNG", "nested/e.gif"]


@pytest.mark.parametrize("changed", [False, True], ids=["as it was", "an image changed inside a finished chunk"])
def test_an_interrupted_run_resumed_gives_the_bytes_of_a_run_never_stopped(clip_artifacts, clip_engine, photos,
                                                                           tmp_path, monkeypatch, changed):
    flags = ("--artifacts", clip_artifacts, "--chunk-rows", "2", "--on-error", "skip")
    out = tmp_path / "out.parquet"
    interrupted_run(clip_engine, EncodeJob(photos, out, chunk_rows=2, on_error="skip", progress=False), monkeypatch,
                    after_chunks=2)
    assert not out.exists()
    if changed:
        (photos / "a.png").write_bytes(IMAGES["nested/d.PNG"])  # same name, other pixels: row 1, in chunk 0
    resumed = encoded(photos, out, *flags)
    changed_words = "chunk 0 (from row 0): the input rows changed since the unfinished run"
    assert (changed_words in resumed.stderr) == changed, resumed.stderr
    assert ("(resumed after 4 rows)" in resumed.stdout and "encoded 2 images" in resumed.stdout) != changed
    encoded(photos, tmp_path / "clean.parquet", *flags)
    assert out.read_bytes() == (tmp_path / "clean.parquet").read_bytes()
    assert (tmp_path / "out.errors.jsonl").read_bytes() == (tmp_path / "clean.errors.jsonl").read_bytes()
    embeddings = read_embeddings(out)
    assert np.array_equal(embeddings[1], embeddings[3]) == changed  # a.png holds nested/d.PNG's pixels, if changed


def test_an_image_text_model_still_encodes_texts_with_its_text_tower(clip_artifacts, reference, tmp_path):
    result = encoded(text_file(tmp_path / "captions.txt", CAPTIONS), tmp_path / "out.parquet", "--artifacts",
                     clip_artifacts)
    assert "encoded 2 texts" in result.stdout
    assert_same_as_transformers(tmp_path / "out.parquet", reference["captions"])
    assert "inputs" not in json.loads(pq.read_schema(tmp_path / "out.parquet").metadata[b"attnserve"])


def test_a_text_model_refuses_images_in_one_line(artifacts, photos, tmp_path):
    out = tmp_path / "out.parquet"
    assert_one_line_error(run_cli("encode", photos, "-o", out, "--artifacts", artifacts),
                          "all-MiniLM-L6-v2 is a text model: it embeds no images")
    assert not out.exists() and not (tmp_path / ".out.parquet.parts").exists()


@pytest.mark.parametrize("case", ["prompt", "int8", "both columns", "image column of a jsonl", "pixels of texts",
                                  "empty folder", "folder of no images", "column of numbers"])
def test_what_does_not_apply_to_images_is_refused_in_one_line(clip_artifacts, photos, tmp_path, case):
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "empty").mkdir()
    (tmp_path / "no-images" / "sub").mkdir(parents=True)
    (tmp_path / "no-images" / "notes.txt").write_text("not an image\n")
    (tmp_path / "no-images" / "sub" / "drawing.svg").write_text("<svg/>")
    pq.write_table(pa.table({"picture": [1, 2]}), tmp_path / "numbers.parquet")
    args, fragment = {
        "prompt": ((photos, "--prompt", "a photo of "), f"--prompt-name / --prompt applies to texts; {photos} holds "
                                                        "images"),
        "int8": ((photos, "--precision-out", "int8"), "--precision-out int8 takes the model's ranges, calibrated on "
                                                      "texts; images take float, binary or ubinary"),
        "both columns": ((tmp_path / "numbers.parquet", "--image-column", "picture", "--text-column", "text"),
                         "give --text-column or --image-column, not both"),
        "image column of a jsonl": ((tmp_path / "in.jsonl", "--image-column", "picture"),
                                    "--image-column names a column of a .parquet file"),
        "pixels of texts": ((tmp_path / "in.jsonl", "--max-image-pixels", "100"),
                            "--max-image-pixels applies to images"),
        "empty folder": ((tmp_path / "empty",), "a folder with no image files in it"),
        "folder of no images": ((tmp_path / "no-images",), "a folder with no image files in it (.png, .jpg"),
        "column of numbers": ((tmp_path / "numbers.parquet", "--image-column", "picture"),
                              "column 'picture' is int64: give image files' bytes (binary) or their paths (strings)"),
    }[case]
    assert_one_line_error(run_cli("encode", *args, "-o", tmp_path / "out.parquet", "--artifacts", clip_artifacts),
                          fragment)


def test_an_empty_folder_with_allow_empty_writes_the_columns(clip_artifacts, tmp_path):
    (tmp_path / "empty").mkdir()
    encoded(tmp_path / "empty", tmp_path / "out.parquet", "--artifacts", clip_artifacts, "--allow-empty")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.num_rows == 0 and table.schema.field("id").type == pa.string()
    assert table.schema.field("embedding").type.list_size == 32


def test_files_are_read_as_their_chunk_is_not_before(photos, tmp_path, monkeypatch):
    """Memory is bounded by a chunk's files: the folder's names are listed, its bytes read chunk by chunk."""
    read = []
    original = image_readers.read_image_file

    def reading(path, limit):
        read.append(path)
        return original(path, limit)

    monkeypatch.setattr(image_readers, "read_image_file", reading)
    chunks = ImageFolder(photos).chunks(2)
    assert [r.id for r in next(chunks)] == ["B.JPG", "a.png"] and len(read) == 2
    assert [r.where for r in next(chunks)] == [CORRUPT, "nested/c.webp"] and len(read) == 4
    pq.write_table(pa.table({"file": [str(photos / n) for n in IMAGES]}), tmp_path / "paths.parquet")
    next(ImageColumn(tmp_path / "paths.parquet", "file").chunks(2))
    assert len(read) == 6  # the column's first chunk's two files, no more


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_file_that_is_not_a_regular_file_is_a_bad_row_not_a_hang(photos):
    os.mkfifo(photos / "pipe.png")
    records = [r for chunk in ImageFolder(photos).chunks(10) for r in chunk]
    assert [(r.where, r.error) for r in records if r.where == "pipe.png"] == [("pipe.png", "not a regular file")]


def test_through_a_server_and_on_ray_the_rows_are_the_local_runs(clip_server, clip_artifacts, clip_engine, photos,
                                                                  tmp_path):
    local, remote = tmp_path / "local.parquet", tmp_path / "remote.parquet"
    encode_file(clip_engine, EncodeJob(photos, local, on_error="skip", progress=False, chunk_rows=3))
    encoded(photos, remote, "--server", clip_server.target, "--on-error", "skip", "--chunk-rows", "3")
    got, want = pq.read_table(remote), pq.read_table(local)
    for column in ("id", "num_tokens", "truncated"):
        assert got.column(column).to_pylist() == want.column(column).to_pylist(), column
    assert np.abs(read_embeddings(remote) - read_embeddings(local)).max() <= 1e-5
    assert [(e["path"], e["reason"]) for e in errors_of(tmp_path / "remote.errors.jsonl")] == [
        (CORRUPT, f"{CORRUPTED}: image file is truncated")]
    pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'attnserve[ray]'")
    from attnserve.offline.ray_encode import encode_file_ray

    # The local engine on the graph every Ray actor runs (the default one), as tests/test_encode_drivers.py's.
    graph = embeddings_graph(load_manifest(clip_artifacts), EngineConfig())[2]
    engine = Engine.from_directory(clip_artifacts, EngineConfig(graph=graph.name))
    local, ray_out = tmp_path / "local2.parquet", tmp_path / "ray.parquet"
    encode_file(engine, EncodeJob(photos, local, on_error="skip", progress=False, chunk_rows=2))
    stats = encode_file_ray(EncodeJob(photos, ray_out, on_error="skip", progress=False, chunk_rows=2),
                            EngineConfig(), clip_artifacts, ray_actors=1)
    assert stats.texts == 5 and stats.skipped == 1 and ray_out.read_bytes() == local.read_bytes()
    assert (tmp_path / "ray.errors.jsonl").read_bytes() == (tmp_path / "local2.errors.jsonl").read_bytes()
