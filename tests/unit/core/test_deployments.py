"""Deployment configs and lookup errors without a cluster (the deployments themselves:
tests/core/test_deployments_on_ray.py)."""

import pytest

import relayllm
from relayllm import DeploymentConfig

# Registered for each test and removed after it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("echo_backend")


def _echo(name, **options):
    return DeploymentConfig(name=name, backend="echo", options=options)


def test_config_itself_rejects_unknown_fields_and_bad_names():
    with pytest.raises(ValueError, match="replicas"):
        DeploymentConfig(name="x", backend="echo", replicas=2)
    with pytest.raises(ValueError, match="name"):
        DeploymentConfig(name="has space", backend="echo")


def test_not_found_lists_the_deployments_of_the_cluster_asked_about(monkeypatch):
    """get_deployment(name, address=A): the running deployments it lists are A's (the
    regression: the message listed those of the default cluster)."""
    from relayllm import deployments
    from relayllm.deployments import DeploymentRef

    def listed(*, address=None):
        name = "on-a" if address == "ray://a:10001" else "on-default"
        return [DeploymentRef(name, deployments.app_name(name), name)]

    monkeypatch.setattr(deployments.names, "list_deployments", listed)  # where lookup reads it
    with pytest.raises(relayllm.DeploymentNotFoundError) as err:
        relayllm.get_deployment("nope", address="ray://a:10001")
    assert "running deployments: on-a." in str(err.value), str(err.value)


def test_one_prefix_for_every_application_and_no_kind_passes_for_another():
    from relayllm.deployments.names import app_name, name_of, running_names

    assert app_name("q") == "relayllm-q"
    gateway = app_name("q", kind="gateway")
    assert gateway == "relayllm-gateway:q"
    assert name_of(gateway) is None and name_of(gateway, kind="gateway") == "q"
    assert name_of("relayllm-gateway", kind="gateway") is None  # a deployment named so
    assert name_of("other-app") is None
    assert running_names(["relayllm-b", gateway, "relayllm-a", "other"]) == ["a", "b"]
    with pytest.raises(relayllm.ConfigError):  # the rule the kinds rely on
        DeploymentConfig(name="gateway:q", backend="echo")
