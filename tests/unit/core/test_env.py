"""relayllm.env is the reader of every RELAYLLM_* variable: the code asks its objects for their
typed values, and no other module names a variable (so none reads one with os.environ, nor
passes one to click); every variable listed is read somewhere; the values parse one way."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from relayllm import env

PACKAGES = Path(__file__).resolve().parents[3] / "packages"
ENV_MODULE = PACKAGES / "core" / "src" / "relayllm" / "env.py"
#: vLLM's engine subprocesses run it before anything can be imported (it hides modules from
#: the import system): it reads the variable by its name, which a test below holds to env's.
BOOT = PACKAGES / "adapter-vllm" / "src" / "relayllm_vllm" / "_boot" / "sitecustomize.py"
#: A string that is a variable's name and nothing else: the key of an environment read.
NAME = re.compile(r"RELAYLLM_[A-Z0-9_]+")


def _sources() -> list[Path]:
    return [
        path for path in sorted(PACKAGES.glob("*/src/**/*.py")) if path not in (ENV_MODULE, BOOT)
    ]


def _names_in(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    exported = {  # ``__all__`` lists Python names, some of that spelling (RELAYLLM_OPTIONS)
        id(node)
        for statement in tree.body
        if isinstance(statement, ast.Assign)
        and any(getattr(t, "id", None) == "__all__" for t in statement.targets)
        for node in ast.walk(statement.value)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and NAME.fullmatch(node.value)
        and id(node) not in exported
    ]


def test_no_module_but_env_names_a_variable_to_read_it():
    sources = _sources()
    assert len(sources) > 100, "the walk found too few modules: the glob is wrong"
    named = [
        f"{path.relative_to(PACKAGES)}:{line} {value}"
        for path in sources
        for line, value in _names_in(path)
    ]
    assert not named, "read these through relayllm.env (env.X.get(), env.X.name):\n" + "\n".join(
        named
    )


def test_the_engines_boot_file_reads_the_variable_env_names():
    assert [value for _, value in _names_in(BOOT)] == [env.HIDE_MODULES.name]


def _attribute_names() -> dict[str, str]:
    """Each variable's Python name in relayllm.env (``VERBOSE`` for ``RELAYLLM_VERBOSE``)."""
    return {
        attr: variable.name
        for attr, variable in vars(env).items()
        if attr.isupper() and variable in env.VARIABLES
    }


def test_every_variable_is_read_somewhere_and_in_its_own_package():
    attributes = _attribute_names()
    assert sorted(attributes.values()) == sorted(env.BY_NAME), "a variable without a name"
    used: dict[str, set[str]] = {}
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        for attr in attributes:
            if re.search(rf"\benv\.{attr}\b", text):
                used.setdefault(attr, set()).add(path.relative_to(PACKAGES).parts[0])
    used.setdefault("HIDE_MODULES", set()).add("adapter-vllm")  # the boot file, above
    unread = sorted(attributes[a] for a in attributes if a not in used)
    assert not unread, f"listed in relayllm.env and read nowhere: {unread}"
    for attr, name in attributes.items():
        package = env.BY_NAME[name].package
        folder = "core" if package == "core" else package.split("-", 1)[1]
        assert {folder, f"adapter-{folder}"} & used[attr], (name, package, used[attr])


def test_each_entry_says_its_default_and_meaning_once():
    names = [v.name for v in env.VARIABLES]
    assert len(names) == len(set(names))
    for variable in env.VARIABLES:
        assert variable.default and variable.meaning.endswith("."), variable
        assert variable.package in (
            "core",
            "relayllm-vllm",
            "relayllm-sglang",
            "relayllm-openai",
            "relayllm-service",
        )


@pytest.mark.parametrize(
    ("value", "on"),
    [
        (None, False),
        ("", False),
        ("0", False),
        ("off", False),
        ("No", False),
        ("1", True),
        ("yes", True),
        ("TRUE", True),
        ("2", True),
    ],
)
def test_a_flag_is_on_for_anything_but_blank_or_a_no(value, on):
    environ = {} if value is None else {env.VERBOSE.name: value}
    assert env.VERBOSE.get(environ) is on


def test_seconds_fall_back_to_their_default_unless_a_positive_number():
    name = env.STALL_WARNING_S.name
    assert env.STALL_WARNING_S.get({}) == 300.0 and env.STALL_WARNING_S.default == "`300`"
    assert env.STALL_WARNING_S.get({name: "2.5"}) == 2.5
    for bad in ("soon", "0", "-1", ""):
        assert env.STALL_WARNING_S.get({name: bad}) == 300.0, bad


def test_names_text_and_transport_parse_one_way():
    assert env.EXTRA_PLUGINS.get({env.EXTRA_PLUGINS.name: " a, ,b:c ,"}) == ["a", "b:c"]
    assert env.EXTRA_PLUGINS.get({}) == []
    assert env.LOG_DIR.get({env.LOG_DIR.name: "  "}) is None
    assert env.STATE_DIR.get({}) == "~/.relayllm/batch-service"
    assert env.STATE_DIR.default == "`~/.relayllm/batch-service`"
    assert env.SERVE_TRANSPORT.get({env.SERVE_TRANSPORT.name: " Actor "}) == "actor"
    assert env.SERVE_TRANSPORT.get({env.SERVE_TRANSPORT.name: "carrier pigeon"}) == "grpc"


def test_the_process_environment_is_read_when_asked(monkeypatch):
    monkeypatch.setenv(env.PROGRESS_INTERVAL_S.name, "3")
    assert env.PROGRESS_INTERVAL_S.get() == 3.0
    monkeypatch.delenv(env.PROGRESS_INTERVAL_S.name)
    assert env.PROGRESS_INTERVAL_S.get() == 10.0
