"""Weighted fair share of the runner's slots among projects (stride scheduling).

When more batches wait than the runner has slots (``max_batches``), each free slot goes to
the project with the lowest *pass*: a number that grows by ``1 / weight`` each time the
project is given a turn, so over many turns a project of weight 2 gets twice the turns of one
of weight 1 (turns are equal in length while batches wait: ``turn_s``). Within a project,
its batches take turns as before: the one whose last turn is longest ago (never: oldest
first). A project that had nothing waiting joins at the lowest pass of the projects still
waiting, not at its old one or zero: it neither makes up for the time it was away (which
would shut the others out) nor is put behind; so a light project's small batch gets one of
the next free slots.

Weights come from the quotas file (``Quota.weight``, default 1). Pure: no store, no Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar


class _Batch(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def project(self) -> str: ...


B = TypeVar("B", bound=_Batch)


class FairShare:
    """The passes of the projects with batches waiting or running."""

    def __init__(self, weight: Callable[[str], float]) -> None:
        self.weight = weight
        self.passes: dict[str, float] = {}

    def pick(self, waiting: Sequence[B], turns: Mapping[str, int]) -> B:
        """The batch the next free slot goes to (``waiting``: oldest first; ``turns``: the
        tick of each batch's last turn)."""
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

    def granted(self, project: str) -> None:
        """A turn given to ``project``."""
        self.passes[project] = self.passes.get(project, 0.0) + 1.0 / self.weight(project)

    def keep_only(self, projects: set[str]) -> None:
        """Forget the projects with nothing unfinished: they rejoin at the others' pass."""
        self.passes = {p: v for p, v in self.passes.items() if p in projects}


__all__ = ["FairShare"]
