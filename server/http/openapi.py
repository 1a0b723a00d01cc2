"""/openapi.json: the description of every route the door serves, built from the route table and the same
pydantic models that parse the bodies (bodies.py), so that it lists what is served and nothing else."""

from __future__ import annotations

import re

import numpy as np
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode

from attnserve.engine.quantize import RANGED

from .. import open_inference as oip
from ..core import ModelInfo
from .bodies import MODEL_MARK
from .cohere_bodies import TEXT_INPUT_TYPES
from .errors import KSERVE, OPENAI
from .kserve import infer_body_schema
from .kserve_bodies import KServeError
from .openai_bodies import OpenAIError
from .route import Route
from .tei_bodies import TeiError, TeiRank, TeiToken

OPENAPI_VERSION = "3.1.0"
# Each route family's error body (TEI's for the rest).
_ENVELOPES: dict[str, type[BaseModel]] = {OPENAI: OpenAIError, KSERVE: KServeError}
_PARAMETER = re.compile(r"\{(\w+)(?::[^}]*)?\}")  # aiohttp's "{id:.+}" is OpenAPI's "{id}"
# JSON Schema's integer admits 8.0 and has no word for how a number is written; the server holds every door to one
# rule (bodies.py), said here for every integer of the description.
INTEGERS = ("Every integer (dimensions, token ids, layers, heads, top_n, a KServe tensor's shape...) is a JSON "
            "integer: 8, not 8.0 or 8e0, which are refused, as OpenAI's API and TEI refuse them.")


def openapi_spec(routes: list[Route], info: ModelInfo, keys_required: bool, outputs: set[str],
                 names: list[str]) -> dict:
    """info: the default model's; outputs: what the served models give, together (ModelInfo.outputs): a route that
    needs another is left out (Route.needs); names: every served model's names and aliases."""
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
        if route.needs is not None and route.needs not in outputs:
            continue
        path = _PARAMETER.sub(r"{\1}", route.path)
        error = ref(_ENVELOPES.get(route.style, TeiError), "serialization")
        reply = ref(route.reply, "serialization") if route.reply else route.reply_schema
        ok: dict[str, object] = {"description": "OK"}
        if reply is not None:
            # The reply's schema for its JSON or page; binary data after a JSON header is bytes to a schema.
            ok["content"] = {kind: {"schema": reply if kind != "application/octet-stream" else
                                    {"type": "string", "format": "binary"}} for kind in route.content_types}
        operation: dict[str, object] = {
            "summary": route.summary,
            "operationId": f"{route.method.lower()}_{_operation_name(path)}",
            "responses": {"200": ok, "default": {"description": "an error: its status is in docs/http.md, Status codes",
                                                 "content": {"application/json": {"schema": error}}}},
        }
        if route.body is not None:
            operation["requestBody"] = {"required": route.body_required,
                                        "content": {"application/json": {"schema": ref(route.body, "validation")}}}
        parameters = [{"name": name, "in": "path", "required": True, "schema": _path_parameter(name, names)}
                      for name in _PARAMETER.findall(route.path)]
        if parameters:
            operation["parameters"] = parameters
        if route.open:
            operation["security"] = []
        paths.setdefault(path, {})[route.method.lower()] = operation
    for schema in schemas.values():
        _model_bounds(schema, info)
    spec: dict[str, object] = {
        "openapi": OPENAPI_VERSION,
        "info": {"title": "attnserve", "version": info.version,
                 "description": f"{info.model}: OpenAI- and text-embeddings-inference-compatible embeddings, "
                                f"reranking, and attention weights. {INTEGERS}"},
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}}},
    }
    if keys_required:
        spec["security"] = [{"apiKey": []}]
    return spec


def _path_parameter(name: str, names: list[str]) -> dict:
    """A path's model name is one served (an alias included), its version the one version (open_inference)."""
    if name in ("name", "id"):
        return {"type": "string", "enum": names}
    if name == "version":
        return {"type": "string", "enum": [oip.VERSION]}
    return {"type": "string"}


def _model_bounds(schema: object, info: ModelInfo) -> None:
    """Each field marked in bodies.py (MODEL_MARK) given what the default model allows, in place."""
    if isinstance(schema, dict):
        mark = schema.pop(MODEL_MARK, None)
        if mark is not None:
            _bound(schema, mark, info)
        for value in schema.values():
            _model_bounds(value, info)
    elif isinstance(schema, list):
        for value in schema:
            _model_bounds(value, info)


def _bound(schema: dict, mark: str, info: ModelInfo) -> None:
    """A field's schema given what the default model allows of the field its mark names."""
    if mark == "token_id":
        schema["maximum"] = info.vocab_size - 1
    elif mark == "max_seq_length":  # JSON Schema's minimum leaves the null of `int | None` valid
        schema["minimum"] = info.max_seq_length
    elif mark == "kserve_infer":
        description = schema.get("description")
        schema.clear()
        schema.update(infer_body_schema(info), **({"description": description} if description else {}))
    elif mark == "images" and "embed_image" not in info.outputs:  # a text model: no image forms
        schema.clear()
        schema["not"] = {}
    elif mark == "nullable_images" and "embed_image" not in info.outputs:  # its null: the field not given
        schema.clear()
        schema["type"] = "null"
    elif mark == "cohere_input_type" and "embed_image" in info.outputs:
        schema["anyOf"] = [{"enum": [*TEXT_INPUT_TYPES, "image"]}, {"type": "null"}]
    elif mark == "pairs" and info.default_prompt_name is not None:
        schema.clear()
        schema["not"] = {}
    elif mark == "truncation_direction" and "embed_multi" in info.outputs:
        schema["enum"] = ["Right", "right"]
    elif mark == "pooling":
        schema.pop("enum", None)
        schema["enum"] = list(info.request_poolings)
    elif mark == "ranged_pooling":
        _ranged_pooling(schema, info)
    elif mark == "cohere_types":  # no ranges in Cohere's body: int8 and uint8 only where the model's serve
        types = [t for t in info.embedding_types
                 if t not in RANGED or "default" not in info.ranged_poolings] + ["base64"]
        schema["anyOf"] = [{"type": "array", "items": {"enum": types}}, {"type": "null"}]
    elif mark in ("layer", "head"):
        count = info.num_layers if mark == "layer" else info.num_heads
        schema.update(minimum=-count, maximum=count - 1)
    elif mark == "dimensions":
        schema.update(minimum=1, maximum=info.embedding_size)
    elif mark in ("prompt_name", "task"):
        names = list(info.prompts) if mark == "prompt_name" else list(info.tasks)
        schema["anyOf"] = [*([{"enum": names}] if names else []), {"type": "null"}]
    elif mark == "ranges":  # [minima, maxima], each of the dimensions returned (_ranges_width)
        finite = float(np.finfo(np.float32).max)  # the codes are computed in float32
        row = {"type": "array", "items": {"type": "number", "minimum": -finite, "maximum": finite},
               "minItems": 1, "maxItems": info.embedding_size}
        schema["anyOf"] = [{"type": "array", "items": row, "minItems": 2, "maxItems": 2}, {"type": "null"}]


def _ranged_pooling(schema: dict, info: ModelInfo) -> None:
    """Without ranges of its own, a request may ask for the types the model serves (int8 and uint8 where it holds
    calibration), and those only under its own pooling."""
    no_ranges = {"anyOf": [{"not": {"required": ["ranges"]}}, {"properties": {"ranges": {"type": "null"}}}]}
    schema.setdefault("allOf", []).append(
        {"if": no_ranges, "then": {"properties": {"embedding_type": {"enum": list(info.embedding_types)}}}})
    ranged = [t for t in info.embedding_types if t in RANGED]
    if info.ranged_poolings and ranged:
        schema["allOf"].append({
            "if": {"properties": {"embedding_type": {"enum": ranged},
                                  "pooling": {"enum": list(info.ranged_poolings)}},
                   "required": ["embedding_type"] + ([] if "default" in info.ranged_poolings else ["pooling"])},
            "then": {"required": ["ranges"], "properties": {"ranges": {"type": "array"}}}})
    schema["allOf"].append(_ranges_width(info.embedding_size))


def _ranges_width(embedding_size: int) -> dict:
    """ranges has a column per dimension returned: the embedding's size without `dimensions`; with it, as many as it
    says, which JSON Schema cannot tie to its value (the field's description says it; the server refuses another
    count, naming both)."""
    return {"if": {"required": ["dimensions"], "properties": {"dimensions": {"type": "integer"}}},
            "else": {"properties": {"ranges": {"items": {"minItems": embedding_size}}}}}


def _operation_name(path: str) -> str:
    """/v1/models/{id} -> v1_models_id; / -> root."""
    return path.strip("/").replace("/", "_").replace("{", "").replace("}", "") or "root"


def index(routes: list[Route], version: str) -> dict:
    """GET /: where a newcomer starts, the help and every route."""
    return {"name": "attnserve", "version": version,
            "help": {"openapi": "/openapi.json", "health": "/health", "models": "/v1/models", "info": "/info"},
            "routes": [route.method + " " + _PARAMETER.sub(r"{\1}", route.path) for route in routes]}
