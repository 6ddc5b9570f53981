"""Which runners ``relayllm unserve`` stops (no cluster): only those no remaining
gateway uses, and an unhealthy gateway's found by name."""

from __future__ import annotations

from relayllm_service.deploy import GatewayRef, runners_to_stop
from relayllm_service.settings import ServiceSettings


def gateway(name: str, state_dir: str | None) -> GatewayRef:
    status = "RUNNING" if state_dir else "UNHEALTHY"
    app = ServiceSettings(name=name).app_name
    return GatewayRef(name, app, status, None, None, state_dir)


def runner(state_dir: str) -> str:
    return ServiceSettings(state_dir=state_dir).runner_name


def test_a_runner_another_gateway_shares_keeps_running():
    a, b = gateway("a", "/s/one"), gateway("b", "/s/one")
    assert runners_to_stop([a], [b], running=lambda: []) == []
    assert runners_to_stop([a, b], [], running=lambda: []) == [runner("/s/one")]


def test_a_runner_of_its_own_state_stops():
    a, b = gateway("a", "/s/one"), gateway("b", "/s/two")
    assert runners_to_stop([a], [b], running=lambda: []) == [runner("/s/one")]


def test_an_unhealthy_gateways_runner_is_found_by_name():
    sick, other = gateway("sick", None), gateway("b", "/s/two")
    running = lambda: [runner("/s/one"), runner("/s/two")]  # noqa: E731
    assert runners_to_stop([sick], [other], running=running) == [runner("/s/one")]
    # another gateway that cannot tell its state either: nothing unknown is stopped
    assert runners_to_stop([sick], [gateway("c", None)], running=running) == []
