"""One HTTP route: what the door registers, the middleware consults and /openapi.json describes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from pydantic import BaseModel

from .errors import WireNames


@dataclass(frozen=True)
class Route:
    method: str  # "GET" or "POST"
    path: str  # aiohttp's pattern, also the `method` label of the request metrics: "/v1/models/{id}"
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    style: str  # the error envelope: errors.OPENAI, errors.TEI or errors.KSERVE
    summary: str
    body: type[BaseModel] | None = None  # the JSON body it takes
    reply: type[BaseModel] | None = None  # its 200 reply, for the description; None: see reply_schema
    reply_schema: dict | None = None  # a 200 reply that is no model (a JSON list)
    names: WireNames = field(default_factory=WireNames)
    open: bool = False  # answered without an API key and while draining: /health
    # What a served model must give (ModelInfo.outputs) for the route to answer anything but a refusal: "embed",
    # "rerank", "predict", "embed_sparse", "embed_multi", "attention", "similarity". /openapi.json describes the
    # operations this server's models answer, and leaves out the others (they answer 400, naming why).
    needs: str | None = None
    content_types: tuple[str, ...] = ("application/json",)  # of its 200 reply
    body_required: bool = True  # where it takes a body: False where an empty one means the defaults
    readiness: bool = False  # a probe: 503 (NotServingError) unless the core is ready, checked by the door


def families(routes: list[Route]) -> dict[str, str]:
    """The error envelope of a path that matches no route (a 404, or a 405 of a path served for other methods),
    by its first segment: that of most routes under it ("v1" and "embeddings" OpenAI's, "v2" KServe's, beside
    which Cohere's POST /v2/embed stands). Paths under no such segment take TEI's, whose routes share no prefix."""
    styles: dict[str, Counter[str]] = {}
    for route in routes:
        styles.setdefault(route.path.lstrip("/").partition("/")[0], Counter())[route.style] += 1
    return {segment: counts.most_common(1)[0][0] for segment, counts in styles.items()
            if len(counts) == 1 or counts.most_common(2)[0][1] > counts.most_common(2)[1][1]}
