"""An upload's ``multipart/form-data`` body parsed as it arrives (python-multipart's streaming
parser over the request's body), the file part written to the file storage a piece at a time:
the gateway holds at most about one :data:`~relayllm_service.store.files.CHUNK` of the file,
whatever its size, and never spools it to a temporary file first. The storage's size limit is
enforced as the bytes cross it.

The form's other parts (``purpose``, ``expires_after[...]``) are small text fields, kept in
memory up to a few kilobytes each. What the fields mean is the gateway's to check: it then
commits the file (moved into place under its id) or discards it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from relayllm_service.errors import InvalidRequestError
from relayllm_service.store.files import CHUNK, FileStorage, FileWriter

#: The part that carries the file (OpenAI's name for it).
FILE_PART = "file"
#: Text fields a form may have besides the file, and the size of one.
MAX_FIELDS = 8
MAX_FIELD_BYTES = 64 * 1024


@dataclass
class ReceivedUpload:
    """A parsed upload: its text fields, and its file written but not yet in place."""

    fields: dict[str, str]
    filename: str | None  # None: the form had no file part
    writer: FileWriter | None = field(default=None, repr=False)

    def commit(self) -> int:
        """Put the file in place under its id; its size. Blocking (pyarrow.fs)."""
        if self.writer is None:
            raise InvalidRequestError("no file part in the form", FILE_PART)
        return self.writer.commit()

    def discard(self) -> None:
        """Delete the bytes written, unless committed. Blocking (pyarrow.fs)."""
        if self.writer is not None:
            self.writer.abort()


class _Part:
    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.name = ""
        self.filename: str | None = None
        self.data = bytearray()  # a text field's value
        self.is_file = False


class _Form:
    """python-multipart's callbacks: the parts' headers and text, and the file's pieces
    waiting to be written (``pending``; the caller writes them between body messages)."""

    def __init__(self, charset: str, max_fields: int, max_field_bytes: int) -> None:
        self.charset = charset
        self.max_fields, self.max_field_bytes = max_fields, max_field_bytes
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.pending = bytearray()
        self.file_parts = 0
        self.text_parts = 0
        self.open_part = False  # inside a part: the body must not end here
        self.ended = False
        self._part = _Part()
        self._header_name = bytearray()
        self._header_value = bytearray()

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": self.on_part_begin,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_end": self.on_end,
        }

    def on_part_begin(self) -> None:
        self._part = _Part()
        self.open_part = True

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        self._part.headers.append((bytes(self._header_name).lower(), bytes(self._header_value)))
        self._header_name.clear()
        self._header_value.clear()

    def on_headers_finished(self) -> None:
        from python_multipart.multipart import parse_options_header

        part = self._part
        disposition = next((v for k, v in part.headers if k == b"content-disposition"), b"")
        _, options = parse_options_header(disposition)
        if b"name" not in options:
            raise InvalidRequestError("a part of the form has no name (Content-Disposition)")
        part.name = self._decode(options[b"name"])
        if b"filename" in options:
            self.file_parts += 1
            if self.file_parts > 1:
                raise InvalidRequestError("one file per upload", FILE_PART)
            if part.name != FILE_PART:
                raise InvalidRequestError(
                    f"the file is in a part named {part.name!r}; it goes in {FILE_PART!r}",
                    FILE_PART,
                )
            part.is_file = True
            self.filename = self._decode(options[b"filename"])
        else:
            self.text_parts += 1
            if self.text_parts > self.max_fields:
                raise InvalidRequestError(f"more than {self.max_fields} fields in the form")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._part.is_file:
            self.pending += memoryview(data)[start:end]
            return
        if len(self._part.data) + end - start > self.max_field_bytes:
            raise InvalidRequestError(
                f"the form field {self._part.name!r} is longer than {self.max_field_bytes:,} bytes"
            )
        self._part.data += data[start:end]

    def on_part_end(self) -> None:
        self.open_part = False
        if not self._part.is_file:
            self.fields[self._part.name] = self._decode(bytes(self._part.data))

    def on_end(self) -> None:
        self.ended = True

    def _decode(self, raw: bytes) -> str:
        try:
            return raw.decode(self.charset)
        except (UnicodeDecodeError, LookupError):
            return raw.decode("latin-1")


async def receive_upload(
    content_type: str | None,
    body: AsyncIterator[bytes],
    storage: FileStorage,
    file_id: str,
    *,
    max_fields: int = MAX_FIELDS,
    max_field_bytes: int = MAX_FIELD_BYTES,
    piece_bytes: int = CHUNK,
) -> ReceivedUpload:
    """Parse the multipart ``body`` (an ASGI request's body messages, e.g. starlette's
    ``request.stream()``) as it arrives, writing the ``file`` part to ``storage`` as
    ``file_id`` in pieces of about ``piece_bytes`` (each written in a thread). Raises
    :class:`InvalidRequestError` for a body that is no multipart form (or a form with more
    than one file, too many or too long fields), and the storage's
    :class:`~relayllm_service.errors.TooLargeError` as soon as the file crosses its
    limit; on any failure nothing of the file is kept. The file is not in place until
    :meth:`ReceivedUpload.commit`."""
    try:
        import python_multipart
        from python_multipart.exceptions import FormParserError
        from python_multipart.multipart import parse_options_header
    except ModuleNotFoundError as exc:  # the http extra is missing
        raise RuntimeError(f"uploads need python-multipart: {exc}") from exc

    kind, params = parse_options_header(content_type or "")
    if kind != b"multipart/form-data" or not params.get(b"boundary"):
        raise InvalidRequestError(
            f"the body is not a multipart form (Content-Type {content_type!r}, "
            "multipart/form-data with a boundary expected)"
        )
    charset = params.get(b"charset", b"utf-8").decode("latin-1")
    form = _Form(charset, max_fields, max_field_bytes)
    # The callbacks are python-multipart's TypedDict, built as a plain dict of the same keys.
    parser = python_multipart.MultipartParser(params[b"boundary"], form.callbacks())  # type: ignore[arg-type]
    writer: FileWriter | None = None
    limit = storage.max_bytes

    async def flush() -> None:
        nonlocal writer
        piece = bytes(form.pending)
        form.pending.clear()
        if writer is None:
            writer = storage.writer(file_id)
        await asyncio.to_thread(writer.write, piece)

    try:
        try:
            async for message in body:
                parser.write(message)
                written = writer.written if writer is not None else 0
                if len(form.pending) >= piece_bytes or written + len(form.pending) > limit:
                    await flush()  # over the limit: the storage refuses it, nothing written
            parser.finalize()
        except FormParserError as exc:
            raise InvalidRequestError(f"the body is not a multipart form: {exc}") from None
        if form.open_part or not form.ended:
            raise InvalidRequestError("the body ended inside the multipart form")
        if form.filename is not None and (form.pending or writer is None):
            await flush()  # the last piece (or an empty file's nothing)
    except BaseException:
        if writer is not None:
            await asyncio.to_thread(writer.abort)
        raise
    return ReceivedUpload(form.fields, form.filename, writer)


__all__ = ["FILE_PART", "ReceivedUpload", "receive_upload"]
