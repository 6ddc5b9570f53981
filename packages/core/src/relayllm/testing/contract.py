"""The engine-free half of the conformance kit: cheap enough to run on every commit.

    from relayllm.testing import BackendContractTests

    class TestMyBackendContract(BackendContractTests):
        backend = "my-backend"
        distribution = "relayllm-my-backend"   # whose entry point registers it
        options = {"model": "..."}

What it checks (no Ray cluster, no engine):

- ``test_backend_discovered_through_entry_point``: the backend is registered, by the named
  distribution's ``relayllm`` entry point (not by an import side effect).
- ``test_options_reject_unknown_keys``: the kit's options are valid and a misspelled key is an
  error naming the key (an ``Options`` model without ``extra="forbid"`` drops it silently) and
  not its value (a value may be a secret).
- ``test_import_stays_light``: importing relayllm and the adapter's plugin module loads none of
  vllm, sglang, torch, openai, transformers (checked in a fresh interpreter).
- ``test_tasks_for_options``: ``Backend.tasks_for(options)`` names known tasks, at least one,
  all within ``Backend.tasks`` (what ``relayllm backends`` lists).
- ``test_unsupported_sampling_param_policy``: the shared policy of
  :mod:`relayllm.adapters` names the backend and the parameter.
- ``test_no_silent_overrides`` (the guard): a standard test may be overridden only to mark it
  ``@pytest.mark.xfail(strict=True, reason=...)``; deleting one (``= None``), overriding it
  otherwise, or skipping the whole class (``@pytest.mark.skip`` / ``skipif`` on the class, or
  ``pytestmark`` in its body) fails -- a class-level skip fails at collection, since it would
  also skip this guard.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from typing import Any, ClassVar

import pytest

import relayllm
from relayllm.plugin import NAME
from relayllm.plugin.manager import get_registry
from relayllm.rows import TASKS

#: Modules that ``import relayllm`` (and importing an adapter's plugin module) must not load.
HEAVY_MODULES = ("vllm", "sglang", "torch", "openai", "transformers")
_SKIPS = ("skip", "skipif")


class _KitMeta(type):
    """Refuses a skip on a kit class: it would skip every check, the guard included, and the
    run would still pass. Mark single tests ``xfail(strict=True, reason=...)`` instead."""

    def __init__(cls, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> None:
        super().__init__(name, bases, namespace)
        _refuse_skip(cls, namespace.get("pytestmark"))

    def __setattr__(cls, name: str, value: Any) -> None:
        if name == "pytestmark":  # how @pytest.mark.skip stores itself on a class
            _refuse_skip(cls, value)
        super().__setattr__(name, value)


def _refuse_skip(cls: type, marks: Any) -> None:
    marks = marks if isinstance(marks, list) else [marks] if marks is not None else []
    skips = [m for m in marks if getattr(m, "name", None) in _SKIPS]
    if skips:
        raise TypeError(
            f"{cls.__qualname__}: a class-level pytest.mark.{skips[0].name} would skip every "
            f"conformance check, the override guard included. Mark single tests "
            f"@pytest.mark.xfail(strict=True, reason=...), or declare what the backend cannot "
            f"do through Backend.tasks_for."
        )


class BackendContractTests(metaclass=_KitMeta):
    """The engine-free checks. :class:`~relayllm.testing.BackendConformanceTests` adds the
    engine checks to these."""

    backend: ClassVar[str]
    #: Distribution whose ``relayllm`` entry point registers the backend (None: registered in
    #: code, like the echo backend).
    distribution: ClassVar[str | None] = None
    options: ClassVar[dict[str, Any]] = {}

    @classmethod
    def backend_class(cls) -> type[relayllm.Backend]:
        return get_registry().get(cls.backend)

    @classmethod
    def served_tasks(cls) -> frozenset[str]:
        """What a deployment with the kit's options serves (``Backend.tasks_for``)."""
        backend = cls.backend_class()
        return backend.tasks_for(backend.parse_options(cls.options))

    @classmethod
    def served_features(cls) -> frozenset[str]:
        """The optional request features a deployment with the kit's options declares
        (``Backend.features_for``): the kit checks each one it declares."""
        backend = cls.backend_class()
        return backend.features_for(backend.parse_options(cls.options))

    # -- checks --------------------------------------------------------------------------------

    def test_backend_discovered_through_entry_point(self):
        registry = get_registry()
        assert self.backend in registry, f"{self.backend!r} not in {registry.names()}"
        if self.distribution is None:
            return
        dist = importlib.metadata.distribution(self.distribution)
        points = [ep for ep in dist.entry_points if ep.group == NAME]
        assert points, f"{self.distribution} declares no entry point in group {NAME!r}"
        origin = registry.origin(self.backend)
        by_it = (
            origin is not None
            and origin.plugin in {ep.name for ep in points}
            and _canonical(origin.distribution) == _canonical(self.distribution)
        )
        assert by_it, f"{self.backend!r} was registered by {origin}, not by {self.distribution}"

    def test_options_reject_unknown_keys(self):
        backend = self.backend_class()
        backend.parse_options(self.options)  # the kit's own options are valid
        secret = "sk-kit-0123456789abcdef-not-for-messages"
        with pytest.raises(relayllm.ConfigError, match="no_such_option_xyz") as caught:
            backend.parse_options({**self.options, "no_such_option_xyz": secret})
        assert secret not in str(caught.value), (
            "the options error repeats a value (it may be a secret); build it with "
            "relayllm.adapters.options_error, or leave parse_options to relayllm.Backend"
        )

    def test_import_stays_light(self):
        modules = ["relayllm"]
        if self.distribution:
            dist = importlib.metadata.distribution(self.distribution)
            modules += [ep.value.split(":")[0] for ep in dist.entry_points if ep.group == NAME]
        code = (
            "import importlib, json, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"loaded = {{m.split('.')[0] for m in sys.modules}}\n"
            f"print(json.dumps(sorted(loaded & set({list(HEAVY_MODULES)!r}))))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        heavy = json.loads(out.stdout.strip().splitlines()[-1])
        assert heavy == [], f"importing {modules} loaded heavy modules {heavy}"

    def test_tasks_for_options(self):
        backend = self.backend_class()
        served = self.served_tasks()
        assert served, f"{self.backend}.tasks_for({self.options}) serves no task"
        assert set(served) <= set(TASKS), f"unknown tasks in {sorted(served)}; known: {TASKS}"
        assert set(served) <= set(backend.tasks), (
            f"tasks_for gives {sorted(served)}, beyond Backend.tasks {sorted(backend.tasks)}"
        )

    def test_unsupported_sampling_param_policy(self):
        from relayllm.adapters import UnsupportedParameter, check_sampling_support

        with pytest.raises(UnsupportedParameter) as caught:
            check_sampling_support(self.backend, {"no_such_param_xyz": 1}, supported=())
        assert self.backend in str(caught.value) and "no_such_param_xyz" in str(caught.value)

    # -- the guard -------------------------------------------------------------------------------

    def test_no_silent_overrides(self):
        """A standard test may be overridden only to xfail it (strict, with a reason)."""
        for name in standard_tests(type(self)):
            mine = getattr(type(self), name, None)
            assert mine is not None, f"standard test {name} was deleted"
            original = _original(type(self), name)
            if mine is original:
                continue
            marks = getattr(mine, "pytestmark", [])
            assert not [m for m in marks if m.name in _SKIPS], (
                f"{name} is skipped: a skipped conformance check passes silently; "
                f"use @pytest.mark.xfail(strict=True, reason=...)"
            )
            xfails = [m for m in marks if m.name == "xfail"]
            assert xfails and all(_reason(m) and m.kwargs.get("strict") for m in xfails), (
                f"{name} is overridden without @pytest.mark.xfail(strict=True, reason=...)"
            )


def _reason(mark: Any) -> str | None:
    return mark.kwargs.get("reason") or (mark.args[1] if len(mark.args) > 1 else None)


def _original(cls: type, name: str) -> Any:
    """The kit's own definition of test ``name`` (the first kit class that defines it)."""
    for base in reversed(cls.__mro__):
        if base.__module__.startswith("relayllm.testing") and name in vars(base):
            return vars(base)[name]
    return None


def standard_tests(cls: type) -> list[str]:
    """The kit's tests a class inherits (the guard itself excluded)."""
    names: dict[str, None] = {}
    for base in cls.__mro__:
        if base.__module__.startswith("relayllm.testing"):
            names.update(
                dict.fromkeys(
                    n
                    for n in vars(base)
                    if n.startswith("test_") and n != "test_no_silent_overrides"
                )
            )
    return list(names)


def _canonical(name: str | None) -> str:
    """A distribution name as the package index compares it (``Foo_bar`` == ``foo-bar``)."""
    return (name or "").lower().replace("_", "-").replace(".", "-")


__all__ = ["HEAVY_MODULES", "BackendContractTests", "standard_tests"]
