"""The image-text models' servers, one per configuration for the whole run, shared by the test files that load this
module as a plugin (`pytest_plugins = ["tests.image_servers"]`: tests/test_image_serving.py, test_offline_images.py,
test_siglip2_serving.py). A plugin's fixtures are the session's, defined once: a fixture imported into several
files would be each file's own, and its server started once per file."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.serving import ServerProcess, serving

# The hosts image_workers fetches image URLs from, and its limits on them.
URL_LIMITS = ("--allow-image-urls", "127.0.0.1", "--max-image-url-bytes", "100000", "--image-url-timeout", "1")


@pytest.fixture(scope="session")
def clip_server(clip_artifacts, tmp_path_factory) -> Iterator[ServerProcess]:
    """The tiny CLIP, served in one process."""
    with serving(ServerProcess(clip_artifacts, log_path=tmp_path_factory.mktemp("clip") / "server.log")) as process:
        yield process


@pytest.fixture(scope="session")
def image_workers(clip_artifacts, siglip2_artifacts, tmp_path_factory) -> Iterator[ServerProcess]:
    """The tiny CLIP (the default model) and the tiny SigLIP 2 ("siglip2") behind two front-door workers: images
    are decoded there, fetched there from URLs (URL_LIMITS), and only their pixels cross to the engine process."""
    process = ServerProcess(None, "--workers", "2", "--model", f"clip={clip_artifacts}", "--model",
                            f"siglip2={siglip2_artifacts}", *URL_LIMITS,
                            log_path=tmp_path_factory.mktemp("image_workers") / "server.log")
    with serving(process):
        yield process
