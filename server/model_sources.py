"""Where the models a server serves come from: --artifacts, --model NAME=DIR or --model-repository DIR, the default
first. A checkpoint given (or the default model, on first use) is exported into the cache first.

Apart from server/models.py, which opens them, so that `serve --workers auto` (workers/auto.py) can find the
default model before prometheus_client is imported (the workers' multiprocess metrics need that order).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from attnserve.config import ServerConfig
from attnserve.engine.manifest import MANIFEST
from attnserve.errors import ConfigError

log = logging.getLogger("attnserve.server")


@dataclass(frozen=True)
class ModelSource:
    name: str | None  # None: the manifest's model name (--artifacts and the default model)
    directory: Path



def model_sources(artifacts: str | None, config: ServerConfig, precision: str = "auto", provider: str = "auto"
                  ) -> list[ModelSource]:
    """The models to serve, the default first; a bad --model or repository is a one-line ConfigError. A checkpoint
    given (or the default model, on first use) is exported into the cache with the graph a run of `precision` on
    `provider` needs first (attnserve/default_model.py)."""
    if (config.model or config.model_repository) and artifacts:
        raise ConfigError("give --artifacts (one model) or --model / --model-repository (several), not both")
    if config.model_repository:
        return _repository(Path(config.model_repository))
    if config.model:
        sources = [_named(spec, precision, provider) for spec in config.model]
        names = [source.name for source in sources]
        twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
        if twice is not None:  # before any model loads; Models.load checks the aliases too
            raise ConfigError(f"the model name {twice!r} is given twice; each model and alias needs its own")
        return sources
    from attnserve.default_model import resolve_artifacts, serving_directory

    if artifacts:
        return [ModelSource(None, serving_directory(Path(artifacts), "--artifacts", precision, provider))]
    return [ModelSource(None, resolve_artifacts(None, precision, provider))]


def _named(spec: str, precision: str, provider: str) -> ModelSource:
    """--model NAME=DIR: an artifact directory, or a checkpoint exported into the cache (once, whatever name it is
    served under), served as NAME (KServe's --model_name and --model_dir in one flag:
    `--model={{.Name}}=/mnt/models`)."""
    from attnserve.default_model import serving_directory

    name, equals, directory = spec.partition("=")
    if not equals or not name.strip() or not directory.strip():
        raise ConfigError(f"--model {spec!r}: give it as NAME=ARTIFACT_DIR")
    path = Path(directory.strip())
    if not path.is_dir():
        raise ConfigError(f"--model {spec!r}: {path} is not a directory")
    return ModelSource(name.strip(), serving_directory(path, f"--model {spec!r}", precision, provider))


def _repository(root: Path) -> list[ModelSource]:
    if not root.is_dir():
        raise ConfigError(f"--model-repository {root}: not a directory")
    sources = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if (folder / MANIFEST).is_file():
            sources.append(ModelSource(folder.name, folder))
        else:
            log.info("skipped: not an artifact directory", extra={"fields": {
                "event": "model_skipped", "folder": str(folder), "reason": f"no {MANIFEST}"}})
    if not sources:
        raise ConfigError(f"--model-repository {root} holds no artifact directory (folders with {MANIFEST}, "
                          "made by `attnserve export --out`)")
    return sources
