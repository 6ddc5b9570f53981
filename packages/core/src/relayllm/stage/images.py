"""Images in chat messages: ``image_url`` parts fetched and checked on the CPU workers (the
stage's actors), so an engine gets only images that decode, and a bad one fails its row.

A part's ``url`` may be ``http(s)://`` (fetched with a time and a size limit), a ``data:``
URL (base64) or a local file (``file://`` URL or an absolute path, read on the worker) unless
``ImageLimits.local_files`` is off (``ProcessorSettings.local_image_files``; the batch service
turns it off): then a local file is refused before the worker's file system is looked at, with
one message whether the path exists or not. ``ImageLimits.remote_hosts``
(``ProcessorSettings.remote_image_hosts``; the batch service allows none unless configured)
limits the hosts an http(s) URL, and each redirect it answers with, may name: a refused one is
never contacted. Each is decoded with Pillow (size and pixel
limits) and travels on as a ``data:`` URL of the same bytes, which every backend reads without
network access from the engine's process. A URL that does not answer, a file that is not
there or bytes that are not an image are that row's ``error``
("messages[0].content[1].image_url: ..."), never a failed job. An error about a local file
never quotes its bytes (Pillow's messages can: a header token), only its path.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from relayllm.errors import RelayLLMError
from relayllm.rows import Request, Result, error_result

#: Formats an engine can be given (Pillow's names).
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


@dataclass(frozen=True)
class ImageLimits:
    """What one image may take: bytes read, seconds to fetch, pixels decoded; and whether it
    may be a local file of the worker (``file://`` or an absolute path)."""

    max_bytes: int = 20 * 1024 * 1024
    timeout_s: float = 10.0
    max_pixels: int = 40_000_000
    local_files: bool = True
    #: Host names an http(s) URL may name (exact, any case); None: any host; empty: none.
    remote_hosts: tuple[str, ...] | None = None


class ImageError(RelayLLMError, ValueError):
    """One image part cannot be used; its message becomes the row's error."""


def has_images(messages: Any) -> bool:
    """Whether a chat has an ``image_url`` part (the common case, text only, costs one scan)."""
    if not isinstance(messages, list):
        return False
    return any(
        isinstance(p, dict) and p.get("type") == "image_url"
        for m in messages
        if isinstance(m, dict) and isinstance(m.get("content"), list)
        for p in m["content"]
    )


def prepare_images(
    messages: list[dict[str, Any]], limits: ImageLimits = ImageLimits()
) -> list[dict[str, Any]] | str:
    """``messages`` with every image part's ``url`` replaced by a checked ``data:`` URL, or
    the reason (naming the part) one image cannot be used. Blocking: run it in a thread."""
    out = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "image_url":
                where = f"messages[{i}].content[{j}].image_url"
                spec = part.get("image_url")
                url = spec.get("url") if isinstance(spec, dict) else spec
                if not isinstance(url, str) or not url:
                    return f"{where} must have a 'url' ({_sources(limits)})"
                try:
                    data_url = checked_data_url(url, limits)
                except ImageError as exc:
                    return f"{where}: {exc}"
                new_spec = dict(spec) if isinstance(spec, dict) else {}
                new_spec["url"] = data_url
                part = {**part, "image_url": new_spec}
            parts.append(part)
        out.append({**message, "content": parts})
    return out


def checked_data_url(url: str, limits: ImageLimits = ImageLimits()) -> str:
    """The image at ``url`` as a ``data:`` URL, once Pillow has decoded it."""
    raw = read_image_bytes(url, limits)
    fmt = decode(raw, limits, quote=not is_local(url))
    return f"data:{FORMATS[fmt]};base64,{base64.b64encode(raw).decode('ascii')}"


def read_image_bytes(url: str, limits: ImageLimits) -> bytes:
    """The bytes behind ``url``, at most ``limits.max_bytes`` of them."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme == "data":
        return _data_url_bytes(url, limits)
    if scheme in ("http", "https"):
        _check_host(url, limits)
        return _fetch(url, limits)
    if is_local(url):
        if not limits.local_files:  # before any look at the file system: same for every path
            raise ImageError(f"local image files are not allowed here: use {_sources(limits)}")
        path = urllib.parse.unquote(urllib.parse.urlsplit(url).path) if scheme else url
        try:
            size = os.path.getsize(path)
            if size > limits.max_bytes:
                raise ImageError(f"{path} is {size} bytes, over the {limits.max_bytes} limit")
            with open(path, "rb") as handle:
                return handle.read()
        except OSError as exc:
            raise ImageError(f"cannot read {path}: {exc.strerror or exc}") from None
    shown = url if len(url) < 60 else url[:57] + "..."
    raise ImageError(f"unsupported image URL {shown!r}: use {_sources(limits)}")


def is_local(url: str) -> bool:
    """Whether ``url`` names a file of the worker: a ``file:`` URL or an absolute path. From
    the string alone: nothing on disk is looked at."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    return scheme == "file" or (not scheme and os.path.isabs(url))


def _sources(limits: ImageLimits) -> str:
    if limits.remote_hosts == ():  # no host allowed
        return "data: or a local file" if limits.local_files else "a data: URL"
    return "http(s)://, data: or a local file" if limits.local_files else "http(s):// or data:"


def _check_host(url: str, limits: ImageLimits) -> None:
    """Refuse, before any connection, an http(s) URL whose host is not allowed."""
    if limits.remote_hosts is None:
        return
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if not limits.remote_hosts:
        raise ImageError("remote images are not allowed here: send the image as a data: URL")
    if host not in {h.lower() for h in limits.remote_hosts}:
        raise ImageError(
            f"images from {_host(url)} are not allowed here: use an allowed host or a data: URL"
        )


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to an allowed host: an allowed host cannot send the worker
    elsewhere."""

    def __init__(self, limits: ImageLimits) -> None:
        self.limits = limits

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        _check_host(newurl, self.limits)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _data_url_bytes(url: str, limits: ImageLimits) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise ImageError("a data: URL must be base64 ('data:image/png;base64,...')")
    if len(payload) * 3 // 4 > limits.max_bytes:
        raise ImageError(f"the data: URL holds more than {limits.max_bytes} bytes")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"the data: URL is not valid base64: {exc}") from None


def _fetch(url: str, limits: ImageLimits) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "relayllm"})
    opener = (
        urllib.request.build_opener()
        if limits.remote_hosts is None
        else urllib.request.build_opener(_CheckedRedirects(limits))
    )
    try:
        with opener.open(request, timeout=limits.timeout_s) as response:
            body = response.read(limits.max_bytes + 1)
    except ImageError:
        raise
    except urllib.error.HTTPError as exc:
        raise ImageError(f"fetching {_host(url)} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:  # refused, timed out, DNS...
        reason = getattr(exc, "reason", exc)
        raise ImageError(f"cannot fetch from {_host(url)}: {reason}") from None
    if len(body) > limits.max_bytes:
        raise ImageError(f"the image from {_host(url)} is over the {limits.max_bytes} byte limit")
    return body


def _host(url: str) -> str:
    """Where a URL points, without its path and query (which may carry a signed token)."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"


def decode(raw: bytes, limits: ImageLimits, *, quote: bool = True) -> str:
    """Decode ``raw`` fully with Pillow; its format name, or ImageError. ``quote=False`` (the
    bytes of a local file): a decoding error names Pillow's exception but not its message,
    which may hold some of the bytes."""
    from PIL import Image  # here: only rows with images pay the import

    try:
        with Image.open(io.BytesIO(raw)) as image:
            fmt = image.format or ""
            width, height = image.size
            if width * height > limits.max_pixels:
                raise ImageError(
                    f"the image is {width}x{height}, over the {limits.max_pixels} pixel limit"
                )
            image.load()  # the whole image: a truncated or corrupt one fails here
    except ImageError:
        raise
    except Exception as exc:  # Pillow's UnidentifiedImageError, OSError, DecompressionBomb...
        why = f"{type(exc).__name__}: {exc}" if quote else type(exc).__name__
        raise ImageError(f"not a readable image ({why})") from None
    if fmt not in FORMATS:
        raise ImageError(f"image format {fmt or 'unknown'} is not one of {', '.join(FORMATS)}")
    return fmt


def image_sizes(messages: Any) -> list[tuple[int, int]]:
    """(width, height) of each image part of already prepared messages (``data:`` URLs)."""
    from PIL import Image

    sizes = []
    for message in messages or []:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = (part.get("image_url") or {}).get("url", "")
                raw = _data_url_bytes(url, ImageLimits())
                with Image.open(io.BytesIO(raw)) as image:
                    sizes.append(image.size)
    return sizes


async def prepare_pending(
    pending: list[tuple[int, Request]],
    results: list[Result],
    local_files: bool = True,
    remote_hosts: list[str] | None = None,
) -> list[tuple[int, Request]]:
    """Chats with ``image_url`` parts get their images fetched, decoded and inlined here, on
    the CPU worker, in threads; a row whose image cannot be used (or
    names a local file, unless ``local_files``, or a host not in ``remote_hosts``) gets the
    reason as its error and is not sent."""
    with_images = [k for k, (_, r) in enumerate(pending) if has_images(r.get("messages"))]
    if not with_images:
        return pending
    limits = ImageLimits(
        local_files=local_files,
        remote_hosts=None if remote_hosts is None else tuple(remote_hosts),
    )
    prepared = await asyncio.gather(
        *(asyncio.to_thread(prepare_images, pending[k][1]["messages"], limits) for k in with_images)
    )
    dropped = set()
    for k, messages in zip(with_images, prepared, strict=True):
        i, request = pending[k]
        if isinstance(messages, str):
            results[i] = error_result(messages)
            dropped.add(k)
        else:
            pending[k] = (i, {**request, "messages": messages})
    return [item for k, item in enumerate(pending) if k not in dropped]


__all__ = [
    "FORMATS",
    "ImageError",
    "ImageLimits",
    "checked_data_url",
    "decode",
    "has_images",
    "image_sizes",
    "is_local",
    "prepare_images",
    "prepare_pending",
    "read_image_bytes",
]
