"""A web server on loopback, in a thread of its own, that image URLs are fetched from (tests/test_images.py fetches
them itself, tests/test_image_serving.py through `serve --allow-image-urls`)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from aiohttp import web


def _redirect(location: str):
    async def handler(request):
        raise web.HTTPFound(location)
    return handler


@contextlib.contextmanager
def image_origin(image: bytes) -> Iterator[str]:
    """Its http://127.0.0.1:PORT for the block: /ok.png (`image`), /to-ok (a redirect to it), /to-elsewhere (to
    localhost), /loop (to itself), /big (4 MB without a length), /big.png (2 MB with one), /slow (after 5 s)."""
    async def ok(request):
        return web.Response(body=image, content_type="image/png")

    async def elsewhere(request):
        raise web.HTTPFound(f"http://localhost:{request.url.port}/ok.png")

    async def big(request):
        reply = web.StreamResponse()
        await reply.prepare(request)
        for _ in range(64):
            await reply.write(b"\0" * 65536)
        return reply

    async def big_png(request):
        return web.Response(body=bytes(2_000_000), content_type="image/png")

    async def slow(request):
        await asyncio.sleep(5)
        return web.Response(body=image, content_type="image/png")

    app = web.Application()
    for path, handler in {"/ok.png": ok, "/to-ok": _redirect("/ok.png"), "/to-elsewhere": elsewhere,
                          "/loop": _redirect("/loop"), "/big": big, "/big.png": big_png, "/slow": slow}.items():
        app.router.add_get(path, handler)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
