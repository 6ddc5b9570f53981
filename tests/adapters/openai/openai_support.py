"""Helpers shared by the OpenAI adapter tests (imported by name: conftest puts this folder on
sys.path, as pytest's importlib mode does not)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

#: The variable the deployments name in ``api_key_env``; its value is a fresh fake key.
KEY_ENV = "RELAYLLM_TEST_OPENAI_KEY"


def ensure_test_key() -> str:
    os.environ.setdefault(KEY_ENV, "sk-relayllm-test-" + secrets.token_hex(16))
    return os.environ[KEY_ENV]


def most_in_window(times: Iterable[float], window_s: float) -> int:
    """The largest number of ``times`` inside any half-open window [t, t + window_s)."""
    ordered = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(ordered):
        while ordered[start] <= t - window_s:
            start += 1
        best = max(best, end - start + 1)
    return best


def most_overlapping(intervals: Iterable[tuple[float, float]]) -> int:
    """The largest number of (start, end) intervals open at one instant."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def run_together(*jobs: Callable[[], Any]) -> list[Any]:
    """Run ``jobs`` at the same time (each in its own thread) and return their results."""
    with ThreadPoolExecutor(len(jobs)) as pool:
        return [f.result() for f in [pool.submit(job) for job in jobs]]
