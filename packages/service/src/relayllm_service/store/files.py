"""The bytes of uploaded and produced files, behind ``pyarrow.fs``: a local directory on one
machine, object storage (any URI ``pyarrow.fs.FileSystem.from_uri`` accepts, or any
``pyarrow.fs.FileSystem``, fsspec ones through ``PyFileSystem``) when several nodes share the
files.

Only bytes live here; who owns a file, its name and purpose are the job store's. A file is
written under a temporary name and moved into place when complete, so a killed upload never
leaves a partial file under an id, and bytes over the size limit are stopped as they cross
the limit (copied a chunk at a time, never held whole) and deleted. The gateway writes an
upload's file through a :class:`FileWriter` as the request's body arrives
(:mod:`~relayllm_service.gateway.uploads`), never spooled whole first. File ids are checked
before they become paths: a client's id can never name anything outside the storage's root.

A process killed while it writes (an upload cut mid-body, a runner killed mid-``put``) leaves
its temporary ``ID.part-XXXX`` file behind; :meth:`FileStorage.remove_parts` sweeps them: a
file id's own (the runner, for the ids a killed finish reserved) or every one not written to
for a while (the runner, on start and periodically: an upload still arriving is left alone).
"""

from __future__ import annotations

import io
import os
import secrets
import time
from collections.abc import Iterable
from typing import Any, BinaryIO

import pyarrow.fs as pafs

from relayllm_service.errors import InvalidRequestError, NotFoundError, TooLargeError
from relayllm_service.ids import is_file_id

#: OpenAI's limit for one uploaded file (512 MB); a server setting.
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
#: The piece read or written at a time: what an upload or a download holds in memory.
CHUNK = 1 << 20
#: What marks a file being written (``ID.part-XXXX``): never a file id (ids have no dot).
PART = ".part-"


class FileStorage:
    """Files by id under one root of one ``pyarrow.fs`` filesystem."""

    def __init__(self, filesystem: Any, base: str = "", max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self._fs = filesystem
        self._base = base.rstrip("/")
        self.max_bytes = max_bytes
        if self._base:
            self._fs.create_dir(self._base, recursive=True)

    @classmethod
    def from_uri(cls, location: str, max_bytes: int = DEFAULT_MAX_BYTES) -> FileStorage:
        """A local directory (created if missing; a relative path is made absolute, as
        pyarrow wants) or a URI (``file://``, ``s3://``, ``gs://``...)."""
        if "://" not in location:
            location = os.path.abspath(location)
        filesystem, base = pafs.FileSystem.from_uri(location)
        return cls(filesystem, base, max_bytes)

    def __repr__(self) -> str:
        return f"FileStorage({type(self._fs).__name__}, {self._base!r})"

    def _path(self, file_id: str) -> str:
        if not is_file_id(file_id):
            raise InvalidRequestError(f"{file_id!r} is not a file id", "file_id")
        return f"{self._base}/{file_id}" if self._base else file_id

    def put(
        self, file_id: str, source: BinaryIO | Iterable[bytes], max_bytes: int | None = None
    ) -> int:
        """Write ``source`` (a readable binary stream, or an iterable of byte pieces) as the
        file ``file_id``; returns its size. Over ``max_bytes`` (default: the storage's) it
        raises :class:`TooLargeError` and keeps nothing."""
        writer = self.writer(file_id, max_bytes)
        try:
            for piece in _pieces(source):
                writer.write(piece)
            return writer.commit()
        except BaseException:
            writer.abort()
            raise

    def writer(self, file_id: str, max_bytes: int | None = None) -> FileWriter:
        """The file ``file_id``, written a piece at a time by whoever has its pieces (the
        gateway, as an upload's body arrives): :meth:`FileWriter.commit` puts it in place,
        :meth:`FileWriter.abort` (also after a failed write) keeps nothing."""
        limit = self.max_bytes if max_bytes is None else max_bytes
        path = self._path(file_id)
        return FileWriter(self._fs, path, f"{path}{PART}{secrets.token_hex(4)}", limit)

    def open(self, file_id: str, offset: int = 0) -> io.BufferedReader:
        """The file for reading, buffered (iterating it gives its lines), from byte ``offset``."""
        path = self._path(file_id)
        try:
            if offset:
                raw = self._fs.open_input_file(path)
                raw.seek(offset)
            else:
                raw = self._fs.open_input_stream(path)
        except FileNotFoundError:
            raise NotFoundError(f"no file {file_id!r}") from None
        except OSError:
            # Object stores do not all say FileNotFoundError; ask before blaming the id.
            if not self.exists(file_id):
                raise NotFoundError(f"no file {file_id!r}") from None
            raise
        return io.BufferedReader(raw, CHUNK)

    def size(self, file_id: str) -> int:
        info = self._fs.get_file_info(self._path(file_id))
        if info.type != pafs.FileType.File:
            raise NotFoundError(f"no file {file_id!r}")
        return int(info.size)

    def exists(self, file_id: str) -> bool:
        return bool(self._fs.get_file_info(self._path(file_id)).type == pafs.FileType.File)

    def delete(self, file_id: str) -> None:
        path = self._path(file_id)
        if not self.exists(file_id):
            raise NotFoundError(f"no file {file_id!r}")
        self._fs.delete_file(path)

    def remove_parts(self, file_id: str | None = None, older_than_s: float = 0.0) -> list[str]:
        """Delete the temporary files a killed writer left: ``file_id``'s (whatever their
        age), or with no id every one last written more than ``older_than_s`` ago; returns
        their names. Object stores list no unfinished multipart upload here: those are the
        bucket's lifecycle rules' to abort."""
        if file_id is not None:
            self._path(file_id)  # checked: a client's id never widens the sweep
        prefix = f"{file_id}{PART}" if file_id is not None else None
        cutoff = time.time() - older_than_s
        selector = pafs.FileSelector(self._base or "/", allow_not_found=True)
        removed = []
        for info in self._fs.get_file_info(selector):
            name = info.base_name
            if info.type != pafs.FileType.File or PART not in name:
                continue
            if prefix is not None and not name.startswith(prefix):
                continue
            if prefix is None and (info.mtime is None or info.mtime.timestamp() > cutoff):
                continue  # being written now, perhaps: a later sweep takes it if it stays
            _delete_quietly(self._fs, info.path)
            removed.append(name)
        return removed


class FileWriter:
    """One file being written under a temporary name: :meth:`write` its pieces (a piece
    that takes it over the limit raises :class:`TooLargeError` and is not written), then
    :meth:`commit` (moved into place, its size returned) or :meth:`abort` (deleted).
    Blocking calls: the gateway makes them in a thread."""

    def __init__(self, filesystem: Any, path: str, partial: str, limit: int) -> None:
        self._fs = filesystem
        self._path, self._partial = path, partial
        self.limit = limit
        self.written = 0
        self._out: Any = None
        self._done = False

    def write(self, piece: bytes) -> None:
        if self._done:
            raise ValueError("the file is already committed or aborted")
        if self.written + len(piece) > self.limit:
            limit = f"{self.limit:,}"
            raise TooLargeError(f"the file is larger than the limit of {limit} bytes", "file")
        if self._out is None:
            self._out = self._fs.open_output_stream(self._partial)
        self._out.write(piece)
        self.written += len(piece)

    def commit(self) -> int:
        if self._done:
            raise ValueError("the file is already committed or aborted")
        try:
            if self._out is None:  # an empty file
                self._out = self._fs.open_output_stream(self._partial)
            self._out.close()
            self._fs.move(self._partial, self._path)
        except BaseException:
            self.abort()
            raise
        self._done = True
        return self.written

    def abort(self) -> None:
        """Delete what was written (nothing if it was committed: that is the store's)."""
        if self._done:
            return
        self._done = True
        if self._out is not None:
            try:
                self._out.close()
            except OSError:
                pass
            _delete_quietly(self._fs, self._partial)


def _pieces(source: BinaryIO | Iterable[bytes]) -> Iterable[bytes]:
    read = getattr(source, "read", None)
    if read is None:
        yield from source
        return
    while piece := read(CHUNK):
        yield piece


def _delete_quietly(filesystem: Any, path: str) -> None:
    try:
        filesystem.delete_file(path)
    except OSError:
        pass  # never written, or already gone: nothing to clean


__all__ = ["CHUNK", "DEFAULT_MAX_BYTES", "PART", "FileStorage", "FileWriter"]
