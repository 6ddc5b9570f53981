"""The adapter contract is versioned, checked at registration without a cluster: an adapter
written against contract 1 registers with a deprecation warning; one built for a contract
this relayllm does not implement is refused (a contract-1 adapter serving rows:
tests/core/test_adapter_contract.py)."""

from __future__ import annotations

import sys
import warnings

import pytest
from first_contract_adapter import FirstBackend, FirstOptions

import relayllm
from relayllm.backend import AdapterContractWarning, BackendRegistry
from relayllm.errors import IncompatibleAdapterError
from relayllm.plugin import CONTRACT_VERSION

# Registered for each test and removed after it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("echo_backend")


def _backend(version: int | None) -> type[relayllm.Backend]:
    return type(f"Backend{version}", (FirstBackend,), {"contract_version": version})


def test_an_adapter_without_a_declared_version_registers_with_a_warning():
    registry = BackendRegistry()
    with pytest.warns(AdapterContractWarning, match="contract_version = 2"):
        registry.add(_backend(None))
    assert registry.get("first-contract").Options is FirstOptions


def test_the_current_contract_registers_silently():
    registry = BackendRegistry()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        registry.add(_backend(CONTRACT_VERSION))


@pytest.mark.parametrize(
    ("version", "advice"),
    [(CONTRACT_VERSION + 1, "upgrade relayllm"), (0, "upgrade the adapter")],
)
def test_an_incompatible_adapter_is_refused_when_it_registers(version, advice):
    registry = BackendRegistry()
    registry.add(_backend(version))
    assert "first-contract" not in registry
    assert advice in registry.refused()["first-contract"]
    with pytest.raises(IncompatibleAdapterError, match=advice):
        registry.get("first-contract")


def test_options_read_as_a_mapping_warn_and_name_the_attribute():
    options = FirstOptions(scale=3)
    with pytest.warns(AdapterContractWarning, match=r"options\.scale"):
        assert options["scale"] == 3
    with pytest.warns(AdapterContractWarning):
        assert options.get("scale") == 3 and options.get("missing", 7) == 7
    with pytest.warns(AdapterContractWarning), pytest.raises(KeyError):
        options["missing"]
    assert "scale" in options and "missing" not in options


@pytest.mark.parametrize(
    ("old", "name"),
    [
        ("replica", "BatchDeployment"),
        ("metrics", "ReplicaMetrics"),
        ("traffic", "BATCH_PRIORITY"),
        ("engine", "BatchDeployment"),
    ],
)
def test_moved_modules_keep_their_old_import_path_with_a_warning(old, name):
    import subprocess

    code = (
        "import warnings; warnings.simplefilter('always')\n"
        f"from relayllm.{old} import {name} as old\n"
        f"from relayllm.serving.{_NEW.get(old, old)} import {name} as new\n"
        "assert old is new\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"relayllm.{old} moved to relayllm.serving.{_NEW.get(old, old)}" in done.stderr


_NEW = {"engine": "replica"}  # 0.1.0's name of the replica module
