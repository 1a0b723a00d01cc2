"""/openapi.json: the description of every route the door serves, built from the route table and the same
pydantic models that parse the bodies (bodies.py), so that it lists what is served and nothing else."""

from __future__ import annotations

import re

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode

from ..core import ModelInfo
from .bodies import KServeError, OpenAIError, TeiError, TeiRank, TeiToken
from .errors import KSERVE, OPENAI
from .route import Route

OPENAPI_VERSION = "3.1.0"
# Each route family's error body (TEI's for the rest).
_ENVELOPES: dict[str, type[BaseModel]] = {OPENAI: OpenAIError, KSERVE: KServeError}
_PARAMETER = re.compile(r"\{(\w+)(?::[^}]*)?\}")  # aiohttp's "{id:.+}" is OpenAPI's "{id}"


def openapi_spec(routes: list[Route], info: ModelInfo, keys_required: bool) -> dict:
    schemas: dict[str, dict] = {}

    def ref(model: type[BaseModel], mode: JsonSchemaMode) -> dict:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}", mode=mode)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
        return {"$ref": f"#/components/schemas/{model.__name__}"}

    ref(TeiToken, "serialization")  # named in /tokenize's reply
    ref(TeiRank, "serialization")  # named in /rerank's reply
    paths: dict[str, dict] = {}
    for route in routes:
        path = _PARAMETER.sub(r"{\1}", route.path)
        error = ref(_ENVELOPES.get(route.style, TeiError), "serialization")
        reply = ref(route.reply, "serialization") if route.reply else route.reply_schema
        ok: dict[str, object] = {"description": "OK"}
        if reply is not None:
            ok["content"] = {"application/json": {"schema": reply}}
        operation: dict[str, object] = {
            "summary": route.summary,
            "operationId": f"{route.method.lower()}_{_operation_name(path)}",
            "responses": {"200": ok, "default": {"description": "an error: its status is in docs/http.md, Status codes",
                                                 "content": {"application/json": {"schema": error}}}},
        }
        if route.body is not None:
            operation["requestBody"] = {"required": True,
                                        "content": {"application/json": {"schema": ref(route.body, "validation")}}}
        parameters = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                      for name in _PARAMETER.findall(route.path)]
        if parameters:
            operation["parameters"] = parameters
        if route.open:
            operation["security"] = []
        paths.setdefault(path, {})[route.method.lower()] = operation
    spec: dict[str, object] = {
        "openapi": OPENAPI_VERSION,
        "info": {"title": "attnserve", "version": info.version,
                 "description": f"{info.model}: OpenAI- and text-embeddings-inference-compatible embeddings, "
                                "reranking, and attention weights"},
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}}},
    }
    if keys_required:
        spec["security"] = [{"apiKey": []}]
    return spec


def _operation_name(path: str) -> str:
    """/v1/models/{id} -> v1_models_id; / -> root."""
    return path.strip("/").replace("/", "_").replace("{", "").replace("}", "") or "root"


def index(routes: list[Route], version: str) -> dict:
    """GET /: where a newcomer starts, the help and every route."""
    return {"name": "attnserve", "version": version,
            "help": {"openapi": "/openapi.json", "health": "/health", "models": "/v1/models", "info": "/info"},
            "routes": [route.method + " " + _PARAMETER.sub(r"{\1}", route.path) for route in routes]}
