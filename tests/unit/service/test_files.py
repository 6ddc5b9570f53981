"""The batch service's file storage on real ``pyarrow.fs`` filesystems: a local directory (as a
path and as a ``file://`` URI), a SubTreeFileSystem, and an fsspec in-memory filesystem
through ``PyFileSystem`` (the path object storage takes). Uploads are streamed, stopped at the
size limit, and leave nothing behind when they fail."""

from __future__ import annotations

import io
import uuid

import pyarrow.fs as pafs
import pytest

from relayllm_service.errors import InvalidRequestError, NotFoundError, TooLargeError
from relayllm_service.ids import is_batch_id, is_file_id, new_batch_id, new_file_id
from relayllm_service.store.files import CHUNK, FileStorage

LINES = b'{"custom_id": "a"}\n{"custom_id": "b"}\n\n{"custom_id": "c"}'


def _memory_fs():
    from fsspec.implementations.memory import MemoryFileSystem

    return pafs.PyFileSystem(pafs.FSSpecHandler(MemoryFileSystem()))


@pytest.fixture(params=["path", "file-uri", "subtree", "fsspec-memory"])
def storage(request, tmp_path):
    root = tmp_path / "files"
    if request.param == "path":
        return FileStorage.from_uri(str(root))
    if request.param == "file-uri":
        return FileStorage.from_uri(root.as_uri())
    if request.param == "subtree":
        tmp_path.joinpath("sub").mkdir()
        return FileStorage(pafs.SubTreeFileSystem(str(tmp_path / "sub"), pafs.LocalFileSystem()))
    # a fresh root in fsspec's process-wide memory store
    return FileStorage(_memory_fs(), f"/relayllm-test-{uuid.uuid4().hex}")


def test_put_open_size_delete(storage):
    file_id = new_file_id()
    assert storage.put(file_id, io.BytesIO(LINES)) == len(LINES)
    assert storage.exists(file_id) and storage.size(file_id) == len(LINES)
    with storage.open(file_id) as handle:
        assert list(handle) == LINES.splitlines(keepends=True), "iterating gives the lines"
    with storage.open(file_id, offset=19) as handle:
        assert handle.read() == LINES[19:]
    storage.delete(file_id)
    assert not storage.exists(file_id)
    for call in (storage.open, storage.size, storage.delete):
        with pytest.raises(NotFoundError, match=file_id):
            call(file_id)


def test_an_upload_over_the_limit_is_stopped_as_it_crosses_it_and_leaves_nothing(storage):
    pulled = []

    def pieces():
        for i in range(100):
            pulled.append(i)
            yield b"x" * 1000

    file_id = new_file_id()
    with pytest.raises(TooLargeError, match="2,500 bytes") as caught:
        storage.put(file_id, pieces(), max_bytes=2500)
    assert caught.value.param == "file"
    assert pulled == [0, 1, 2], "the body was read past the piece that crossed the limit"
    assert not storage.exists(file_id)
    assert _names(storage) == [], "a partial upload was left"


def test_a_failed_upload_leaves_nothing_and_a_good_one_replaces_nothing_else(storage):
    def broken():
        yield b"first piece\n"
        raise ConnectionResetError("client went away")

    kept, lost = new_file_id(), new_file_id()
    storage.put(kept, [b"kept\n"])
    with pytest.raises(ConnectionResetError):
        storage.put(lost, broken())
    assert not storage.exists(lost)
    assert _names(storage) == [kept]


def test_the_storage_limit_applies_when_none_is_given(tmp_path):
    small = FileStorage.from_uri(str(tmp_path), max_bytes=10)
    with pytest.raises(TooLargeError):
        small.put(new_file_id(), io.BytesIO(b"x" * 11))
    assert small.put(new_file_id(), io.BytesIO(b"x" * 10)) == 10
    with pytest.raises(ValueError):
        FileStorage.from_uri(str(tmp_path), max_bytes=0)


def test_a_large_file_streams_through_in_pieces(tmp_path):
    """More than one piece each way (the body is never read or written whole)."""
    storage = FileStorage.from_uri(str(tmp_path))
    body = b"0123456789abcdef\n" * (CHUNK // 8)  # ~2 pieces
    file_id = new_file_id()
    assert storage.put(file_id, io.BytesIO(body)) == len(body)
    with storage.open(file_id) as handle:
        assert sum(len(line) for line in handle) == len(body)


@pytest.mark.parametrize(
    "bad", ["../escape", "file-../../etc", "file-a/b", "batch_abc", "file-", "", "file-a b"]
)
def test_ids_that_are_not_file_ids_never_reach_the_filesystem(tmp_path, bad):
    storage = FileStorage.from_uri(str(tmp_path / "files"))
    for call in (
        lambda: storage.put(bad, [b"x"]),
        lambda: storage.open(bad),
        lambda: storage.size(bad),
        lambda: storage.delete(bad),
    ):
        with pytest.raises(InvalidRequestError, match="not a file id"):
            call()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["files"]


def test_new_ids_have_openais_shapes_and_do_not_repeat():
    files = {new_file_id() for _ in range(1000)}
    batches = {new_batch_id() for _ in range(1000)}
    assert len(files) == len(batches) == 1000
    assert all(is_file_id(f) and f.startswith("file-") for f in files)
    assert all(is_batch_id(b) and b.startswith("batch_") for b in batches)
    assert not any(is_file_id(b) or is_batch_id(f) for f, b in zip(files, batches, strict=True))


def _names(storage):
    selector = pafs.FileSelector(storage._base, recursive=True)
    return sorted(info.base_name for info in storage._fs.get_file_info(selector))
