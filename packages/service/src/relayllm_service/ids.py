"""Ids shaped like OpenAI's (``file-...``, ``batch_...``), and the check that an id given by a
client is one: file ids become storage paths, so anything else is refused before it reaches a
filesystem."""

from __future__ import annotations

import re
import secrets
import string

_ALPHABET = string.ascii_letters + string.digits
_FILE_ID = re.compile(r"file-[A-Za-z0-9]{1,64}")
_BATCH_ID = re.compile(r"batch_[A-Za-z0-9]{1,64}")


def new_file_id() -> str:
    """``file-`` and 24 random letters and digits (OpenAI's shape; ~142 bits)."""
    return "file-" + "".join(secrets.choice(_ALPHABET) for _ in range(24))


def new_batch_id() -> str:
    """``batch_`` and 32 random hex digits (OpenAI's shape; 128 bits)."""
    return "batch_" + secrets.token_hex(16)


def is_file_id(value: object) -> bool:
    return isinstance(value, str) and _FILE_ID.fullmatch(value) is not None


def is_batch_id(value: object) -> bool:
    return isinstance(value, str) and _BATCH_ID.fullmatch(value) is not None


__all__ = ["is_batch_id", "is_file_id", "new_batch_id", "new_file_id"]
