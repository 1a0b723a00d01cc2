"""The measurement behind the HTTP door's stack (docs/performance.md, "The HTTP stack"): requests/s of an OpenAI-shaped
embeddings handler on each candidate stack, under `wrk -t1 -c64`.

Each server parses the body, hops once through the event loop (as awaiting the batcher does) and answers a
384-float reply written with orjson, as floats or base64. Needs wrk on PATH, and fastapi, starlette and uvicorn
(not attnserve's dependencies). Stacks and formats are interleaved, ROUNDS times:

    python bench/bench_http_stack.py
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import orjson

STACKS = ("fastapi-pydantic", "fastapi-raw", "starlette", "aiohttp")
FORMATS = ("base64", "float")
ROUNDS, SECONDS, PORT = 2, 5, 18080
VECTOR = np.random.default_rng(0).standard_normal(384).astype("<f4")
POST_LUA = 'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = os.getenv("BODY")\n'


def reply(body: dict) -> dict:
    n = 1 if isinstance(body["input"], str) else len(body["input"])
    embedding = (base64.b64encode(VECTOR.tobytes()).decode() if body.get("encoding_format") == "base64"
                 else VECTOR)
    return {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": embedding} for i in range(n)],
            "model": body.get("model"), "usage": {"prompt_tokens": 7, "total_tokens": 7}}


def dumps(value) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


async def hop() -> None:
    await asyncio.sleep(0)


def fastapi_app(pydantic_body: bool):
    from fastapi import FastAPI, Request
    from fastapi.responses import Response
    from pydantic import BaseModel

    app = FastAPI()

    class Body(BaseModel):
        input: str | list[str] | list[int] | list[list[int]]
        model: str | None = None
        encoding_format: str = "float"
        dimensions: int | None = None
        user: str | None = None

    if pydantic_body:
        @app.post("/v1/embeddings")
        async def embeddings(body: Body):
            await hop()
            return Response(dumps(reply(body.model_dump())), media_type="application/json")
    else:
        @app.post("/v1/embeddings")
        async def embeddings(request: Request):
            body = orjson.loads(await request.body())
            await hop()
            return Response(dumps(reply(body)), media_type="application/json")
    return app


def starlette_app():
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def embeddings(request):
        body = orjson.loads(await request.body())
        await hop()
        return Response(dumps(reply(body)), media_type="application/json")
    return Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])


async def serve_uvicorn(app) -> None:
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=PORT, log_level="error", access_log=False, loop="asyncio")
    await uvicorn.Server(config).serve()


async def serve_aiohttp(embeddings, port: int = PORT) -> None:
    """The bare aiohttp stack: embeddings (an aiohttp handler) on POST /v1/embeddings at 127.0.0.1:port, until the
    process ends (bench_front_door.py's bare HTTP server too)."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/v1/embeddings", embeddings)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def aiohttp_embeddings(request):
    from aiohttp import web

    body = orjson.loads(await request.read())
    await hop()
    return web.Response(body=dumps(reply(body)), content_type="application/json")


def serve(stack: str) -> None:
    """The server of one stack, on the default asyncio loop (grpc.aio's)."""
    if stack == "aiohttp":
        asyncio.run(serve_aiohttp(aiohttp_embeddings))
    elif stack == "starlette":
        asyncio.run(serve_uvicorn(starlette_app()))
    else:
        asyncio.run(serve_uvicorn(fastapi_app(stack == "fastapi-pydantic")))


def measure(stack: str, fmt: str, lua: str) -> float:
    server = subprocess.Popen([sys.executable, __file__, "--serve", stack])
    try:
        time.sleep(2.5)
        body = orjson.dumps({"input": "The quick brown fox jumps over the lazy dog", "model": "m",
                             "encoding_format": fmt}).decode()
        out = subprocess.run(["wrk", "-t1", "-c64", f"-d{SECONDS}s", "-s", lua, f"http://127.0.0.1:{PORT}/v1/embeddings"],
                             capture_output=True, text=True, env={**os.environ, "BODY": body}, check=True).stdout
        return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as lua:
        lua.write(POST_LUA)
    print(f"{'round':<6} {'stack':<18} {'format':<7} requests/s")
    for round_ in range(ROUNDS):
        for stack in STACKS:
            for fmt in FORMATS:
                print(f"{round_:<6} {stack:<18} {fmt:<7} {measure(stack, fmt, lua.name):,.0f}", flush=True)
    os.unlink(lua.name)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        main()
