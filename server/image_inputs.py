"""An image as a request names it -> its bytes, door-neutral: a data URI, bare base64, or (only where the server
allows the host) an http(s) URL, fetched under limits. Every refusal is an ImageError (attnserve/images.py), a 4xx.

The forms are those clients send today: OpenAI-style and Cohere's image_url / data URIs
("data:image/png;base64,...."), Jina's and Infinity's bare base64 or URL strings. The bytes are then decoded by
attnserve/images.py, which judges the format by content and holds the declared type to it.

URLs: a server that fetches what a request names can be made to reach what only it can reach (SSRF: a cloud's
metadata address, an admin port on localhost). So none is fetched unless the operator lists the host
(`allowed_hosts`, exact names, compared after each redirect too), and then only over http(s), with a bound on the
bytes, the time and the redirects; a redirect to a host off the list is refused, not followed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import aiohttp

from attnserve.errors import InvalidInputError
from attnserve.images import ImageError

DATA_URI = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,",
                      re.IGNORECASE)
BASE64_CHARS = re.compile(rb"^[A-Za-z0-9+/_-]*={0,2}$")


# An image's decoded bytes, as a door reads them: bounded only by the message's own size (max_request_bytes, checked
# before it is parsed).
MAX_IMAGE_BYTES = 2**31


@dataclass(frozen=True)
class ImageBytes:
    data: bytes
    declared: str | None  # the MIME type the request gave, if any


@dataclass(frozen=True)
class ImageUrl:
    """An image a request names by http(s) URL: fetched by the core (fetch_image) before the request is prepared,
    where the server allows its host."""

    url: str


@dataclass(frozen=True)
class UrlPolicy:
    """Which URLs are fetched and under what bounds; the default fetches none."""

    allowed_hosts: tuple[str, ...] = ()
    max_bytes: int = 20 * 2**20
    timeout_s: float = 10.0
    max_redirects: int = 3


def is_url(value: str) -> bool:
    return value[:8].lower().startswith(("http://", "https://"))


def image_of(value: str, field: str, row: int | None = None) -> ImageBytes | ImageUrl:
    """An image string as clients send it -> the core's image input, or a 4xx naming the field."""
    if is_url(value):
        return ImageUrl(value)
    try:
        return image_from_string(value, MAX_IMAGE_BYTES)
    except InvalidInputError as error:
        where = f"input {row}: " if row is not None else ""
        raise InvalidInputError(f"{where}{error}", field=field, description=str(error)) from None


def image_from_string(value: str, max_bytes: int) -> ImageBytes:
    """A data URI or bare base64 -> the bytes (at most max_bytes decoded). A URL is not decoded here (fetch_image)."""
    if is_url(value):
        raise ImageError("an image URL must be fetched (fetch_image), not decoded")
    declared = None
    payload = value
    match = DATA_URI.match(value)
    if match:
        if not match["b64"]:
            raise ImageError("a data URI image must be base64 (data:image/png;base64,...)")
        declared, payload = match["type"], value[match.end():]
    elif value[:5].lower() == "data:":
        raise ImageError("the data URI is malformed (data:image/png;base64,...)")
    elif "://" in value[:16]:
        raise ImageError(f"image URLs are fetched over http(s) only, not {value.split('://', 1)[0]!r}")
    if len(payload) > (max_bytes * 4) // 3 + 4:
        raise ImageError(f"the image is over this server's limit of {max_bytes:,} bytes")
    raw = re.sub(r"\s+", "", payload).encode("ascii", "replace")
    if not BASE64_CHARS.match(raw):
        raise ImageError("the image is not base64 (nor a data URI or an http(s) URL)")
    padded = raw.rstrip(b"=") + b"=" * (-len(raw.rstrip(b"=")) % 4)
    try:  # the standard alphabet, or the URL-safe one (- and _), which some clients send
        data = base64.urlsafe_b64decode(padded) if b"-" in raw or b"_" in raw else base64.b64decode(padded,
                                                                                                   validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageError(f"the image's base64 is malformed: {e}") from None
    if len(data) > max_bytes:
        raise ImageError(f"the image is over this server's limit of {max_bytes:,} bytes")
    return ImageBytes(data, declared)


async def fetch_image(url: str, policy: UrlPolicy, session: aiohttp.ClientSession) -> ImageBytes:
    """The bytes at url, where the policy allows its host (and each redirect's), within its bounds."""
    if not policy.allowed_hosts:
        raise ImageError("this server fetches no image URLs: send the image as base64 or a data URI "
                         "(the operator allows hosts with --allow-image-urls)")
    try:
        return await asyncio.wait_for(_fetch(url, policy, session), policy.timeout_s)
    except asyncio.TimeoutError:
        raise ImageError(f"fetching the image URL took over {policy.timeout_s:g} s") from None
    except aiohttp.ClientError as e:
        raise ImageError(f"fetching the image URL failed: {type(e).__name__}") from None


async def _fetch(url: str, policy: UrlPolicy, session: aiohttp.ClientSession) -> ImageBytes:
    for _ in range(policy.max_redirects + 1):
        _check_allowed(url, policy)
        async with session.get(url, allow_redirects=False) as reply:
            if reply.status in (301, 302, 303, 307, 308):
                url = urljoin(url, reply.headers.get("Location", ""))
                continue
            if reply.status != 200:
                raise ImageError(f"fetching the image URL answered HTTP {reply.status}")
            if (reply.content_length or 0) > policy.max_bytes:
                raise ImageError(f"the image at the URL is over this server's limit of {policy.max_bytes:,} bytes")
            data = bytearray()
            async for chunk in reply.content.iter_chunked(64 * 1024):
                data += chunk
                if len(data) > policy.max_bytes:  # a server that sent no length, or lied about it
                    raise ImageError(f"the image at the URL is over this server's limit of "
                                     f"{policy.max_bytes:,} bytes")
            declared = reply.content_type if reply.content_type.startswith("image/") else None
            return ImageBytes(bytes(data), declared)
    raise ImageError(f"the image URL redirected more than {policy.max_redirects} times")


def _check_allowed(url: str, policy: UrlPolicy) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ImageError(f"image URLs are fetched over http(s) only, not {parts.scheme!r}")
    if parts.username or parts.password:
        raise ImageError("an image URL may not carry credentials")
    host = (parts.hostname or "").lower()
    if host not in policy.allowed_hosts:
        raise ImageError(f"this server does not fetch images from {host!r} (allowed: "
                         f"{', '.join(policy.allowed_hosts)})")
