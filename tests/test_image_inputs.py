"""How a request names an image (server/image_inputs.py): data URIs and base64 decoded under a byte limit, and URLs
fetched only from the hosts the operator allows, under size, time and redirect limits, from a real HTTP server on
loopback."""

from __future__ import annotations

import asyncio
import base64

import aiohttp
import pytest
from aiohttp import web

from attnserve.images import ImageError
from attnserve.server.image_inputs import UrlPolicy, fetch_image, image_from_string

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQ"
                       "AAAABJRU5ErkJggg==")  # one pixel


def test_data_uris_and_base64_forms():
    encoded = base64.b64encode(PNG).decode()
    assert image_from_string(f"data:image/png;base64,{encoded}", 1000).declared == "image/png"
    assert image_from_string(f"data:image/png;base64,{encoded}", 1000).data == PNG
    assert image_from_string(encoded, 1000).data == PNG and image_from_string(encoded, 1000).declared is None
    assert image_from_string(encoded.rstrip("="), 1000).data == PNG  # unpadded
    assert image_from_string(base64.urlsafe_b64encode(PNG).decode(), 1000).data == PNG
    wrapped = "\n".join(encoded[i:i + 20] for i in range(0, len(encoded), 20))  # MIME's line breaks
    assert image_from_string(wrapped, 1000).data == PNG


@pytest.mark.parametrize(("value", "fragment"), [
    ("data:image/png,rawbytes", "must be base64"),
    ("data:;;;", "malformed"),
    ("file:///etc/passwd", "http\\(s\\) only, not 'file'"),
    ("not base64 at all!", "is not base64"),
    ("QUJD" * 1000, "over this server's limit of 1,000 bytes"),
])
def test_malformed_forms_are_refused_in_one_line(value, fragment):
    with pytest.raises(ImageError, match=fragment):
        image_from_string(value, 1000)


def _redirect(location: str):
    async def handler(request):
        raise web.HTTPFound(location)
    return handler


def _origin_app(port: int) -> web.Application:
    """A loopback HTTP server: /ok.png, a redirect to it, a redirect off the allowed host, an endless redirect, a
    large body without a length, and a slow one."""
    async def ok(request):
        return web.Response(body=PNG, content_type="image/png")

    async def big(request):
        reply = web.StreamResponse()
        await reply.prepare(request)
        for _ in range(64):
            await reply.write(b"\0" * 65536)
        return reply

    async def slow(request):
        await asyncio.sleep(5)
        return web.Response(body=PNG)

    app = web.Application()
    app.router.add_get("/ok.png", ok)
    app.router.add_get("/to-ok", _redirect("/ok.png"))
    app.router.add_get("/to-elsewhere", _redirect(f"http://localhost:{port}/ok.png"))
    app.router.add_get("/loop", _redirect("/loop"))
    app.router.add_get("/big", big)
    app.router.add_get("/slow", slow)
    return app


@pytest.fixture
def origin(free_tcp_port) -> int:
    return free_tcp_port


async def _fetch(port: int, path: str, policy: UrlPolicy):
    runner = web.AppRunner(_origin_app(port))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session:
            return await fetch_image(f"http://127.0.0.1:{port}{path}", policy, session)
    finally:
        await runner.cleanup()


ALLOWED = UrlPolicy(allowed_hosts=("127.0.0.1",), max_bytes=1_000_000, timeout_s=1.0, max_redirects=3)


def test_an_allowed_host_is_fetched_and_redirects_within_it_followed(origin):
    fetched = asyncio.run(_fetch(origin, "/ok.png", ALLOWED))
    assert fetched.data == PNG and fetched.declared == "image/png"
    assert asyncio.run(_fetch(origin, "/to-ok", ALLOWED)).data == PNG


@pytest.mark.parametrize(("path", "policy", "fragment"), [
    ("/ok.png", UrlPolicy(), "fetches no image URLs"),
    ("/ok.png", UrlPolicy(allowed_hosts=("example.com",)), "does not fetch images from '127.0.0.1'"),
    ("/to-elsewhere", ALLOWED, "does not fetch images from 'localhost'"),
    ("/loop", ALLOWED, "redirected more than 3 times"),
    ("/big", ALLOWED, "over this server's limit of 1,000,000 bytes"),
    ("/slow", ALLOWED, "took over 1 s"),
    ("/missing", ALLOWED, "answered HTTP 404"),
])
def test_urls_off_the_policy_are_refused(origin, path, policy, fragment):
    with pytest.raises(ImageError, match=fragment):
        asyncio.run(_fetch(origin, path, policy))
