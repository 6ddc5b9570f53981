"""Where a weight update's checkpoint is read from, on the replica's side.

``relayllm.control(name).update_weights(source, version=...)`` names a checkpoint each replica
reads: a directory on the replica's node, or a filesystem URI (``s3://``, ``gs://``,
``hdfs://``, ``file://``... anything ``pyarrow.fs.FileSystem.from_uri`` accepts, else fsspec's,
if installed). A URI's directory is copied to a local temporary directory first -- engines
load from a local path -- and removed once the engine has loaded it.

Nothing here imports pyarrow at module level: this module is imported by every replica.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable


def is_uri(source: str) -> bool:
    return "://" in source


def fetch_checkpoint(source: str) -> tuple[str, Callable[[], None]]:
    """A local directory holding the checkpoint ``source`` names, and what to call once the
    engine has loaded it (removes a copy; nothing for a local directory). Blocking: run it in
    a thread. Raises ``FileNotFoundError`` when ``source`` is not a directory."""
    if not is_uri(source):
        if not os.path.isdir(source):
            raise FileNotFoundError(f"no checkpoint directory at {source}")
        return source, lambda: None
    import pyarrow.fs as pafs

    filesystem, root = _filesystem(source)
    if filesystem.get_file_info(root).type != pafs.FileType.Directory:
        raise FileNotFoundError(f"no checkpoint directory at {source}")
    local = tempfile.mkdtemp(prefix="relayllm-weights-")
    try:
        pafs.copy_files(
            root,
            local,
            source_filesystem=filesystem,
            destination_filesystem=pafs.LocalFileSystem(),
        )
    except BaseException:
        shutil.rmtree(local, ignore_errors=True)
        raise
    return local, lambda: shutil.rmtree(local, ignore_errors=True)


def checkpoint_digest(path: str) -> str:
    """relayllm's digest of the checkpoint in the local directory ``path``: SHA-256 over
    every file's relative path and bytes, in path order. Replicas that read the same
    checkpoint agree on it; one whose copy differs (a partial transfer, another node's
    directory of the same name) does not. Blocking: run it in a thread."""
    digest = hashlib.sha256()
    files = []
    for root, dirs, names in os.walk(path):
        dirs.sort()
        files += [os.path.join(root, name) for name in names]
    for file in sorted(files):
        relative = os.path.relpath(file, path).replace(os.sep, "/")
        digest.update(relative.encode() + b"\0")
        with open(file, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return f"sha256:{digest.hexdigest()}"


def _filesystem(source: str):  # -> (pyarrow.fs.FileSystem, path inside it)
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(source)
    except ValueError:  # pyarrow's ArrowInvalid: a scheme it does not know
        pass
    try:
        import fsspec
    except ImportError:
        raise ValueError(
            f"cannot read {source!r}: pyarrow.fs knows no such filesystem and fsspec is not "
            "installed"
        ) from None
    fs, path = fsspec.core.url_to_fs(source)
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


__all__ = ["checkpoint_digest", "fetch_checkpoint", "is_uri"]
