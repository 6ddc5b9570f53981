"""Ray across hosts with addresses of their own (tests/hosts/conftest.py): the cluster is
up on those addresses, then a worker host is partitioned mid-job for longer than Ray's node
timeout and restored. One cluster for the module; the tests run in order on it."""

from __future__ import annotations


def test_each_node_runs_at_its_hosts_address(hosts):
    alive = sorted(n["ip"] for n in hosts.nodes() if n["alive"])
    assert alive == [h.address for h in hosts.hosts]
