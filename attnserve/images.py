"""An image a request sends, decoded under limits, or refused in one line (ImageError, a 4xx on every door).

What a server decodes is untrusted, so the bytes are read as an image only when they are one of a few raster
formats, judged by their content (a declared MIME type must agree with it), and only when their size is within
bounds, checked from the header before a pixel is decompressed:
- vector files (SVG, or any XML) and formats Pillow hands to other programs (EPS runs Ghostscript) are refused;
- a width or height of 0, or more than max_pixels in all (decompression bombs: the limit is below Pillow's own
  MAX_IMAGE_PIXELS, so a bomb is refused here, not warned about there), is refused from the header;
- animations and other multi-frame files are refused (which frame is meant is not the server's guess), but for a
  camera's MPO, whose first frame is the picture;
- corrupt and truncated data is refused: Pillow's LOAD_TRUNCATED_IMAGES stays off.
Memory is then bounded by max_pixels, not by the file. EXIF orientation is applied, as transformers' load_image
applies it, so a phone's rotated JPEG is seen upright.
"""

from __future__ import annotations

import io

from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from attnserve.errors import InvalidInputError

# Pillow's names of the formats decoded, and the MIME types that name each.
FORMATS = {"PNG": ("image/png",), "JPEG": ("image/jpeg", "image/jpg", "image/pjpeg"), "MPO": ("image/jpeg",),
           "WEBP": ("image/webp",), "GIF": ("image/gif",), "BMP": ("image/bmp", "image/x-ms-bmp"),
           "TIFF": ("image/tiff",)}
MIME_TYPES = {mime for mimes in FORMATS.values() for mime in mimes}
OPENED = tuple(f for f in FORMATS if f != "MPO")  # Pillow opens an MPO as a JPEG and then names it MPO
DEFAULT_MAX_PIXELS = 25_000_000  # 5,000 x 5,000: 75 MB as RGB; Pillow's own bomb limit is 89,478,485
XML_STARTS = (b"<", b"\xef\xbb\xbf<")  # SVG and other XML, with or without a byte-order mark


class ImageError(InvalidInputError):
    """An image that is not decoded: what is wrong with it, in one line."""


def decode_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, declared: str | None = None) -> Image.Image:
    """The image in `data`, upright (EXIF orientation applied) and loaded, or ImageError. declared: the MIME type
    the request gave (a data URI's), which must name the format the bytes are."""
    if not data:
        raise ImageError("the image is empty (0 bytes)")
    if declared is not None and declared.lower() not in MIME_TYPES:
        raise ImageError(f"image type {declared!r} is not accepted (only {', '.join(sorted(MIME_TYPES))})")
    if data.lstrip(b" \t\r\n").startswith(XML_STARTS):
        raise ImageError("SVG and other XML images are refused: vector files are not rasterized (send PNG or JPEG)")
    try:
        # The header only: nothing decompressed. Past twice its MAX_IMAGE_PIXELS Pillow refuses here; between once
        # and twice it only warns, and the server's own limit, below it, refuses below.
        image = Image.open(io.BytesIO(data), formats=OPENED)
    except Image.DecompressionBombError as e:
        raise ImageError(f"the image is over the limit of {max_pixels:,} pixels (--max-image-pixels; "
                         f"{_first_line(e)})") from None
    except UnidentifiedImageError:
        raise ImageError(f"the image cannot be read as {', '.join(OPENED)} (corrupt, or another format; its first "
                         f"bytes: {data[:8]!r})") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise ImageError(f"the image is corrupt: {_first_line(e)}") from None
    fmt = str(image.format)
    if declared is not None and declared.lower() not in FORMATS[fmt]:
        raise ImageError(f"the image was declared {declared} but its bytes are {fmt}")
    width, height = image.size
    if width < 1 or height < 1:
        raise ImageError(f"the image has no pixels ({width} x {height})")
    if width * height > max_pixels:
        raise ImageError(f"the image is {width} x {height} = {width * height:,} pixels, over the limit of "
                         f"{max_pixels:,}")
    frames = int(getattr(image, "n_frames", 1))
    if frames > 1 and fmt != "MPO":
        raise ImageError(f"the image has {frames} frames (an animation or a multi-page file): send one frame")
    if ImageFile.LOAD_TRUNCATED_IMAGES:  # set by some other code in this process: Pillow would pad what is missing
        raise ImageError("this process decodes truncated images as if whole (PIL.ImageFile.LOAD_TRUNCATED_IMAGES), "
                         "so it decodes none")
    try:
        image.load()
        return ImageOps.exif_transpose(image)
    except Exception as e:  # noqa: BLE001 -- Pillow's decoders and its EXIF reader raise many kinds on bad data
        raise ImageError(f"the image is corrupt or truncated ({fmt}): {_first_line(e)}") from None


def _first_line(error: Exception) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0][:200]
