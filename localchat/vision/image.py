"""A picture the user attaches: read safely, checked to be a raster image, kept by content hash.

Only a regular file (or a pipe's bytes for ``-``) of at most ``MAX_IMAGE_BYTES`` is read. Pillow
reads the header first, so a picture whose size is over ``MAX_PIXELS`` (a decompression bomb: a
few kilobytes claiming 20,000 × 20,000) is refused before any pixel is decoded; then every pixel
is decoded once, so a truncated or corrupt file is refused too, before anything is sent or kept.
Vector drawings (SVG), anything Pillow does not read as PNG, JPEG, WebP, GIF or BMP, and a picture
carrying over a megabyte of metadata (EXIF, ICC, text chunks) are refused.
The bytes kept are the file's own for PNG, JPEG and WebP (what every server takes) and a PNG of
the first frame otherwise; metadata such as EXIF travels only inside the file's own bytes.
"""

from __future__ import annotations

import base64
import hashlib
import io
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from localchat.errors import UsageError
from localchat.files import read_named

IMAGE_PART_TYPES = ("image_url", "input_image", "image")  # a picture's part: OpenAI's, Responses', Anthropic's

MAX_IMAGE_BYTES = 20 * 1024**2
MAX_PIXELS = 40_000_000  # 8,000 × 5,000: past any photo or screenshot; 20,000 × 20,000 is not a picture to chat about
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif", "BMP": "image/bmp"}
KEPT_AS_IS = {"PNG", "JPEG", "WEBP"}
MAX_METADATA_BYTES = 1024**2  # EXIF, ICC profile, XMP and text chunks together: a camera's is tens of kilobytes


@dataclass(frozen=True)
class ImageRef:
    """An image as history, records, the log and saved sessions keep it; its bytes are stored once,
    under ``digest`` (sha256 of the bytes)."""

    digest: str
    name: str
    width: int
    height: int
    mime: str
    tokens: int | None = None  # what the model's processor makes of it, when known

    def label(self) -> str:
        """How a terminal shows it: ``[image: red-circle.png, 128×128, 16 tokens]``."""
        tokens = f", {self.tokens} tokens" if self.tokens is not None else ""
        return f"[image: {self.name}, {self.width}×{self.height}{tokens}]"

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "name": self.name, "width": self.width, "height": self.height,
                "mime": self.mime, "tokens": self.tokens}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ImageRef:
        return cls(digest=str(raw["digest"]), name=str(raw["name"]), width=int(raw["width"]),
                   height=int(raw["height"]), mime=str(raw["mime"]), tokens=raw.get("tokens"))


@dataclass(frozen=True)
class Picture:
    """An image with its bytes: what a user turn carries."""

    ref: ImageRef
    data: bytes = field(repr=False, compare=False)

    def data_url(self) -> str:
        return f"data:{self.ref.mime};base64,{base64.b64encode(self.data).decode('ascii')}"

    def part(self) -> dict[str, Any]:
        """The OpenAI content part that sends it."""
        return {"type": "image_url", "image_url": {"url": self.data_url()}}

    def with_tokens(self, tokens: int | None) -> Picture:
        return Picture(ref=replace(self.ref, tokens=tokens), data=self.data)


def read_picture(path_text: str, where: str = "--image") -> Picture:
    """The file (or stdin's bytes for ``-``) as a checked picture, or one line saying why not."""
    if path_text == "-":
        data = sys.stdin.buffer.read(MAX_IMAGE_BYTES + 1)
        return picture_from_bytes(data, "stdin", where)
    path, data = read_named(path_text, MAX_IMAGE_BYTES, where, safe_name)
    return picture_from_bytes(data, path.name, where, shown=path_text)


def picture_from_bytes(data: bytes, name: str, where: str = "--image", shown: str | None = None) -> Picture:
    """Check ``data`` is one raster picture within the limits; the bytes to keep and their ref
    (``name``); errors name it as the user gave it (``shown``)."""
    said = safe_name(shown or name)
    if len(data) > MAX_IMAGE_BYTES:
        raise UsageError(f"{where}: {said} is over {MAX_IMAGE_BYTES // 1024**2} MiB: too large to send")
    if not data:
        raise UsageError(f"{where}: {said} is empty")
    head = data[:1024].lstrip().lower()
    if head.startswith((b"<svg", b"<?xml", b"<!doctype svg")) or b"<svg" in head:
        raise UsageError(f"{where}: {said} is an SVG drawing: only pictures (PNG, JPEG, WebP, GIF, BMP) can be sent")
    image = _opened(data, said, where)
    name = safe_name(name)
    fmt = image.format
    if fmt in KEPT_AS_IS:
        kept, mime = data, FORMATS[fmt]
    else:
        buffer = io.BytesIO()
        image.convert("RGBA" if "A" in image.getbands() else "RGB").save(buffer, format="PNG")
        kept, mime = buffer.getvalue(), "image/png"
    ref = ImageRef(digest=hashlib.sha256(kept).hexdigest(), name=name, width=image.width, height=image.height,
                   mime=mime)
    return Picture(ref=ref, data=kept)


def safe_name(name: str) -> str:
    """A file name as a label shows it: control characters (a terminal's escapes) made visible, at most
    80 characters."""
    shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in name)
    return shown if len(shown) <= 80 else shown[:79] + "…"


def _opened(data: bytes, name: str, where: str) -> Any:
    """The decoded picture (its first frame); Pillow's own checks, each turned into one line."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=list(FORMATS))
            if image.width * image.height > MAX_PIXELS:
                raise UsageError(f"{where}: {name} is {image.width}×{image.height} pixels, over the limit of "
                                 f"{MAX_PIXELS:,}: resize it first")
            image.load()
            metadata = sum(len(v) for v in image.info.values() if isinstance(v, (bytes, str)))
            if metadata > MAX_METADATA_BYTES:
                raise UsageError(f"{where}: {name} carries {metadata:,} bytes of metadata (EXIF, text): over "
                                 f"{MAX_METADATA_BYTES:,}, refused")
    except UnidentifiedImageError:
        raise UsageError(f"{where}: {name} is not a picture localchat can read (PNG, JPEG, WebP, GIF or BMP)") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise UsageError(f"{where}: {name} claims more pixels than any picture to chat about (a decompression bomb): "
                         "refused") from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise UsageError(f"{where}: {name} is damaged or truncated ({str(exc).splitlines()[0] or type(exc).__name__})"
                         ) from None
    return image


def shown_text(content: str | list[dict[str, Any]] | None, labels: dict[str, str] | None = None) -> str:
    """A message's content as a terminal shows it: pictures as their labels (``ImageRef.label``),
    or ``[image]`` for one this session does not know, never their bytes."""
    if not isinstance(content, list):
        return content or ""
    shown = []
    for part in content:
        if part.get("type") == "text":
            shown.append(str(part.get("text", "")))
        elif part.get("type") in IMAGE_PART_TYPES:
            url = part.get("image_url", {}).get("url", "") if isinstance(part.get("image_url"), dict) else ""
            shown.append((labels or {}).get(url, "[image]"))
    return "\n".join(shown)


def labels_of(pictures: list[Picture] | tuple[Picture, ...]) -> dict[str, str]:
    """Each picture's data URL → its label, for ``shown_text``."""
    return {picture.data_url(): picture.ref.label() for picture in pictures}


def sample_picture() -> Picture:
    """A red circle on white, 200 × 160 (``examples/images/red-circle.png``): what parity shows a vision model."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (200, 160), (255, 255, 255))
    ImageDraw.Draw(image).ellipse([60, 40, 140, 120], fill=(220, 30, 30))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return picture_from_bytes(buffer.getvalue(), "red-circle.png")


def decoded(picture_bytes: bytes) -> Any:
    """A PIL image of bytes ``read_picture`` already checked (for the in-process model)."""
    from PIL import Image

    image = Image.open(io.BytesIO(picture_bytes))
    return image.convert("RGB")


def bytes_of_data_url(url: str) -> bytes:
    """The bytes of a ``data:image/...;base64,...`` URL (how history carries an image)."""
    head, _, payload = url.partition(",")
    if not head.startswith("data:") or ";base64" not in head:
        raise UsageError("an image must come as a data: URL with base64 content")
    try:
        return base64.b64decode(payload, validate=True)
    except ValueError:
        raise UsageError("an image's data URL is not valid base64") from None
