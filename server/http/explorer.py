"""GET /explorer: the attention explorer's page (attnserve/explorer_page.py), served with a Content-Security-Policy
that allows exactly its inline scripts and style and requests to this server, so that no text of an input can run as
script in it."""

from __future__ import annotations

from aiohttp import web

from attnserve import explorer_page

from .errors import TEI
from .route import Route


class ExplorerRoutes:
    def routes(self) -> list[Route]:
        # Open: the page itself needs no key; it sends the one typed into it on its API calls.
        return [Route("GET", "/explorer", self.page, TEI, "the attention explorer: an HTML page over /v1/attention",
                      reply_schema={"type": "string"}, open=True, content_types=("text/html",))]

    async def page(self, request: web.Request) -> web.Response:
        html, policy = explorer_page.page()
        return web.Response(text=html, content_type="text/html", charset="utf-8", headers={
            "Content-Security-Policy": policy, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"})
