"""The local cluster relayllm starts runs its workers (engines included) at normal priority."""

from __future__ import annotations

import os

from relayllm import cluster


def test_workers_at_normal_priority_while_ray_starts(monkeypatch):
    monkeypatch.delenv(cluster.NICENESS_ENV, raising=False)
    with cluster._workers_at_normal_priority():
        assert os.environ[cluster.NICENESS_ENV] == "0"  # what a raylet started here inherits
    assert cluster.NICENESS_ENV not in os.environ  # the driver's environment as it was


def test_a_users_niceness_is_kept(monkeypatch):
    monkeypatch.setenv(cluster.NICENESS_ENV, "10")
    with cluster._workers_at_normal_priority():
        assert os.environ[cluster.NICENESS_ENV] == "10"
    assert os.environ[cluster.NICENESS_ENV] == "10"
