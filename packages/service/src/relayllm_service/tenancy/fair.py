"""Weighted fair share of the runner's slots among projects (stride scheduling over lines).

When more batches wait than the runner has slots (``max_batches``), each free slot goes to
the project with the lowest *pass*: the batch lines its turns wrote, divided by its weight,
so over time a project of weight 2 writes twice the lines of one of weight 1. Lines, not
turns: turns of equal time are not turns of equal lines (a turn ends only at a block's end,
blocks shrink as a batch's unfinished lines do, and the engines' speed changes), and a pass
counted in turns let one project's turns write ten times the other's. A turn is charged an
estimate when it is given (the mean of the turns so far), so several slots filled at once
spread across projects, and corrected to the lines it wrote when it ends (:meth:`ended`):
an uneven turn is made up by the next choices instead of adding up.

Within a project, its batches take turns as before: the one whose last turn is longest ago
(never: oldest first). A project that had nothing waiting joins at the lowest pass of the
projects still waiting, not at its old one or zero: it neither makes up for the time it was
away (which would shut the others out) nor is put behind; so a light project's small batch
gets one of the next free slots.

A turn given while other batches wait runs at most its project's weight x ``turn_lines``
(``ServiceSettings.turn_lines``) of its batch's lines (:meth:`FairShare.turn_lines`): turns
of equal lines per weight, so the shares are even over a few turns, not only over many.

Weights come from the quotas file (``Quota.weight``, default 1). Pure: no store, no Ray;
called from the runner's loop and its batches' threads (one lock).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from relayllm.batch.scan import Scan


class _Batch(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def project(self) -> str: ...


B = TypeVar("B", bound=_Batch)

#: How fast the estimate of a turn's lines follows the turns that ended (a running mean).
ESTIMATE_WEIGHT = 0.25


class FairShare:
    """The passes of the projects with batches waiting or running."""

    def __init__(self, weight: Callable[[str], float], lines_per_weight: int = 1000) -> None:
        self.weight = weight
        self.lines_per_weight = lines_per_weight
        self.passes: dict[str, float] = {}
        #: Lines a turn is charged when given, until it ends (1 until a turn has ended).
        self.mean_turn = 1.0
        self._charged: dict[str, tuple[str, float]] = {}  # batch -> (project, pass added)
        self._lock = threading.Lock()

    def pick(self, waiting: Sequence[B], turns: Mapping[str, int]) -> B:
        """The batch the next free slot goes to (``waiting``: oldest first; ``turns``: the
        tick of each batch's last turn)."""
        with self._lock:
            projects = {b.project for b in waiting}
            floor = min((self.passes[p] for p in projects if p in self.passes), default=0.0)
            for project in projects:
                self.passes.setdefault(project, floor)

            def order(i: int) -> tuple[int, int]:  # last turn longest ago, then oldest
                return turns.get(waiting[i].id, 0), i

            def next_of(project: str) -> int:
                return min((i for i, b in enumerate(waiting) if b.project == project), key=order)

            def rank(project: str) -> tuple[float, tuple[int, int]]:
                return self.passes[project], order(next_of(project))

            return waiting[next_of(min(projects, key=rank))]

    def turn_lines(self, project: str) -> int:
        """The lines a turn of ``project`` runs while others wait: its weight x
        ``lines_per_weight``, at least one."""
        return max(1, round(self.weight(project) * self.lines_per_weight))

    def granted(self, project: str, batch: str | None = None) -> None:
        """A turn given to ``project`` (for ``batch``: corrected by :meth:`ended`), charged
        as long as the turns so far were."""
        with self._lock:
            added = self.mean_turn / self.weight(project)
            self.passes[project] = self.passes.get(project, 0.0) + added
            if batch is not None:
                self._charged[batch] = (project, added)

    def ended(self, batch: str, lines: int | None) -> None:
        """The turn of ``batch`` ended having written ``lines`` (None: it never ran, e.g.
        its claim was held elsewhere; it stays charged as an average turn)."""
        with self._lock:
            project, added = self._charged.pop(batch, ("", 0.0))
            if lines is None or not project:
                return
            if project in self.passes:  # else it has nothing unfinished: forgotten
                self.passes[project] += lines / self.weight(project) - added
            if lines > 0:
                self.mean_turn += ESTIMATE_WEIGHT * (lines - self.mean_turn)

    def keep_only(self, projects: set[str]) -> None:
        """Forget the projects with nothing unfinished: they rejoin at the others' pass."""
        with self._lock:
            self.passes = {p: v for p, v in self.passes.items() if p in projects}


def hold_back(scan: Scan, lines: int) -> int:
    """Leave only the first ``lines`` lines of ``scan`` to run (a turn's share): the others
    are marked not to run, so they are neither sent nor written and the next turn's scan
    finds them undone. Returns how many were held back. (Lines bad at a glance are written
    whatever the turn: they cost nothing.)"""
    from relayllm.batch.scan import SKIP

    held, kept = 0, []
    for chunk in scan.chunks:
        for i, key in enumerate(chunk.keys):
            if key == SKIP:
                continue
            if lines > 0:
                lines -= 1
            else:
                chunk.keys[i] = SKIP
                scan.key_lines[key] -= 1
                held += 1
        if chunk.keys.count(SKIP) != len(chunk.keys):
            kept.append(chunk)
    scan.chunks = kept
    return held


__all__ = ["FairShare", "hold_back"]
