"""The one duplicate check of a batch file's ``custom_id`` values, in a fixed size per line.

A pass over the file (the service's validation, the driver's scan) adds each line's
``custom_id`` to an :class:`IdLines`: a 128-bit BLAKE2b digest of the id and the line's number,
20 bytes a line whatever the ids hold, instead of a table of the id strings. At the end of the
pass :meth:`IdLines.repeats` sorts the digests (numpy) and reads the repeats off equal
neighbours. Two different ids share a digest with a chance of about ``lines**2 / 2**129``
(below 1e-26 at 1M lines), so the check is exact in practice.

The digests do not say what the ids were: an error that names them re-reads the lines it
reports (:func:`ids_on_lines`), on the failure path only.

:class:`IdSet` is the same digests as a frozen set (the ids a stopped run already wrote, which
a resumed one skips): 16 bytes an id, sorted, with an index of their first two bytes; a look-up
is a digest and a search of about ``ids / 65536`` digests. A digest shared by two ids would
skip a line that never ran, so the 128 bits matter here too.
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Iterable
from hashlib import blake2b
from typing import TYPE_CHECKING

from relayllm.batch.format import parse_envelope

if TYPE_CHECKING:
    import numpy as np

#: Bytes of a custom_id's digest.
DIGEST_SIZE = 16


def digest(custom_id: str) -> bytes:
    """The 128-bit digest of a custom_id (a lone surrogate, which JSON allows, included)."""
    return blake2b(custom_id.encode("utf-8", "surrogatepass"), digest_size=DIGEST_SIZE).digest()


class IdLines:
    """Each line's ``custom_id`` in one pass over a file, as its digest and the line's number
    (the lines added in ascending order)."""

    def __init__(self) -> None:
        self._digests = bytearray()
        self._lines = array("I")

    def __len__(self) -> int:
        return len(self._lines)

    def add(self, custom_id: str, line: int) -> None:
        self._digests += digest(custom_id)
        self._lines.append(line)

    def repeats(self) -> tuple[np.ndarray, np.ndarray]:
        """``(lines, firsts)``: every line whose custom_id an earlier line has, ascending, and
        for each the first line with that id. Empty arrays when the ids are unique."""
        import numpy as np

        lines = np.frombuffer(self._lines, dtype=np.uint32)
        if len(lines) < 2:
            return lines[:0].copy(), lines[:0].copy()
        halves = np.frombuffer(self._digests, dtype=np.uint64).reshape(-1, 2)
        order = np.lexsort((halves[:, 1], halves[:, 0]))  # stable: a run's lines ascending
        ordered = halves[order]
        same = (ordered[1:] == ordered[:-1]).all(axis=1)  # each with the one before it
        del ordered
        if not same.any():
            return lines[:0].copy(), lines[:0].copy()
        starts = np.concatenate(([True], ~same))  # the first of each run of equal digests
        run = np.cumsum(starts) - 1
        sorted_lines = lines[order]
        firsts = sorted_lines[starts][run]
        repeated = ~starts
        found, first = sorted_lines[repeated], firsts[repeated]
        by_line = np.argsort(found, kind="stable")
        return found[by_line], first[by_line]


class IdSet:
    """A frozen set of custom_ids kept as their digests: ``custom_id in ids``, ``len(ids)``
    (distinct ids). Anything but a string is never in it."""

    _BUCKETS = 1 << 16  # by the digests' first two bytes

    def __init__(self, digests: bytes | bytearray = b"") -> None:
        """From the concatenated digests of the ids (:func:`digest`; repeats allowed)."""
        self._keys, self._starts = b"", array("I")
        if not digests:
            return
        import numpy as np

        halves = np.frombuffer(digests, dtype=">u8").reshape(-1, 2)  # in byte order
        halves = halves[np.lexsort((halves[:, 1], halves[:, 0]))]
        if len(halves) > 1:
            distinct = (halves[1:] != halves[:-1]).any(axis=1)
            halves = halves[np.concatenate(([True], distinct))]
        self._keys = halves.tobytes()
        prefixes = halves[:, 0] >> np.uint64(48)  # the first two bytes, ascending
        starts = np.searchsorted(prefixes, np.arange(self._BUCKETS + 1, dtype=np.uint64))
        self._starts = array("I", starts.astype(np.uint32).tobytes())

    def __len__(self) -> int:
        return len(self._keys) // DIGEST_SIZE

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __contains__(self, custom_id: object) -> bool:
        if not isinstance(custom_id, str) or not self._keys:
            return False
        return self.has_digest(digest(custom_id))

    def has_digest(self, key: bytes) -> bool:
        """Whether ``key`` (a :func:`digest`) is one of the set's."""
        if not self._keys:
            return False
        bucket = key[0] << 8 | key[1]
        start = self._starts[bucket] * DIGEST_SIZE
        end = self._starts[bucket + 1] * DIGEST_SIZE
        at = self._keys.find(key, start, end)
        while at >= 0 and at % DIGEST_SIZE:  # across two digests: not one of them
            at = self._keys.find(key, at + 1, end)
        return at >= 0


def ids_on_lines(lines: Iterable[bytes], wanted: Collection[int]) -> dict[int, str]:
    """The ``custom_id`` of each ``wanted`` line (1-based) of ``lines``, read again; the
    reading stops after the last one wanted."""
    found: dict[int, str] = {}
    if not wanted:
        return found
    last = max(wanted)
    for number, raw in enumerate(lines, start=1):
        if number in wanted:
            custom_id = parse_envelope(raw.decode("utf-8", "replace"), number).custom_id
            if custom_id is not None:
                found[number] = custom_id
        if number >= last:
            break
    return found


__all__ = ["DIGEST_SIZE", "IdLines", "IdSet", "digest", "ids_on_lines"]
