"""Core's import graph: no loop and no upward import.

Every ``import`` of a ``relayllm`` module counts -- at module level and inside functions (a
function-local import hides a loop from Python, not from the design) -- except the ones under
``if TYPE_CHECKING:``, which never run. Each module sits on a layer (LAYERS, lowest first); a
module may import modules of its own layer or lower ones, never a higher one. A new module
must be given a layer here, which is also where its place in the design is decided.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import relayllm

# Registered for each test and removed after it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("echo_backend")

SOURCE = Path(relayllm.__file__).parent

#: Lowest first. A name matches the module itself and, with a trailing ".", every module
#: under that package.
LAYERS: list[tuple[str, ...]] = [
    # the foundation: errors, the row protocol, policies with no relayllm dependency
    (
        "relayllm.errors",
        "relayllm.rows",
        "relayllm.rows.",
        "relayllm.retry",
        "relayllm.logs",
        "relayllm.compat",
        "relayllm.openai_body",  # OpenAI bodies <-> rows: both front doors, on rows alone
        "relayllm.openai_responses",  # the Responses API as a chat, on openai_body
        "relayllm.routing",  # the affinity policy: keys -> replicas, bounded load
        "relayllm.env",  # the list of RELAYLLM_* variables: data, imports nothing
        "relayllm.configbase",  # the strict base of every config model (the replica's too)
        "relayllm.bounded_json",  # the one JSON reader of every door: stdlib only
    ),
    # the one HTTP layer both servers are route sets on (the front's, the gateway's)
    ("relayllm.http", "relayllm.http."),
    # what runs in a Serve replica: on the foundation only; and the control calls fanned out
    # to every replica, from a driver or from a replica's control routes
    ("relayllm.serving", "relayllm.serving."),
    # the stage's helpers: image_url parts (also the echo backend's), grouping rows into calls
    ("relayllm.stage", "relayllm.stage.images", "relayllm.stage.calls"),
    # the one fit check: what will run, as data, against the cluster
    ("relayllm.plugin", "relayllm.versions", "relayllm.data_context", "relayllm.fit"),
    # what an adapter provides, and what adapters share
    ("relayllm.backend", "relayllm.adapters", "relayllm.adapters.", "relayllm.cluster"),
    # the config models (below the stage, which needs ProcessorConfig) and the block sizes
    ("relayllm.config", "relayllm.blocks"),
    # where replicas run as users steer it (a config model, over the backend's options)
    ("relayllm.placement",),
    # deprecated import paths of what moved into serving/ (gone in 0.3), and the wrapper that
    # runs contract-2 adapters on the replica (gone with contract 4)
    ("relayllm.metrics", "relayllm.traffic", "relayllm.plugin.legacy"),
    ("relayllm.plugin.spec", "relayllm.plugin.manager"),
    # the driver: names -> Serve apps, what a pipeline asks of the cluster, the session that
    # stops what it started
    ("relayllm.deployments", "relayllm.deployments."),
    # what runs in Ray Data's workers: the stage
    (
        "relayllm.stage.udf",
        "relayllm.stage.columns",
        "relayllm.stage.affinity",
        "relayllm.stage.transport",
        "relayllm.stage.tasks",
    ),
    ("relayllm.processor",),
    # pipelines (with their one resume) and batch files, on processors and deployments
    # (a file's deployments section is read as a pipeline file is: its reader sits here)
    (
        "relayllm.pipelines",
        "relayllm.pipelines.",
        "relayllm.batch",
        "relayllm.batch.",
        "relayllm.deployments.file",
    ),
    # the public facade, then what sits on top of it
    ("relayllm",),
    ("relayllm.testing", "relayllm.testing."),
    # the command and what a plugin's command builds on (the SDK's part that needs the CLI)
    ("relayllm.cli", "relayllm.cli.", "relayllm.adapters.commands"),
]


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (length of the match, layer)
    for index, names in enumerate(LAYERS):
        for name in names:
            hit = module == name or (name.endswith(".") and module.startswith(name))
            if hit and (best is None or len(name) > best[0]):
                best = (len(name), index)
    if best is None:
        raise AssertionError(f"{module} has no layer: add it to LAYERS in {__file__}")
    return best[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in SOURCE.rglob("*.py")}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The relayllm modules ``path`` imports (anywhere but under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from relayllm import deployments` imports the submodule relayllm.deployments;
            # `from relayllm import Backend` imports the package itself.
            subs = [f"{node.module}.{a.name}" for a in node.names]
            names = [n if n in known else node.module for n in subs]
        else:
            continue
        for name in names:
            if name in known:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(path, known) - {name} for name, path in found.items()}


def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
        for a, targets in sorted(graph().items())
        for b in sorted(targets)
        if layer_of(b) > layer_of(a)
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_loop():
    edges = graph()
    loops: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                loops.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not loops, "import loops:\n" + "\n".join(" -> ".join(loop) for loop in loops)


def test_the_checker_sees_function_local_imports_and_skips_type_checking(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from relayllm.stage.udf import ServeStage\n"
        "def f():\n    from relayllm import deployments\n"
        "def g():\n    from relayllm import Backend\n",
        encoding="utf-8",
    )
    known = {"relayllm", "relayllm.stage.udf", "relayllm.deployments"}
    assert imports_of(source, known) == {"relayllm", "relayllm.deployments"}
