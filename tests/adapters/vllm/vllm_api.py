"""The vLLM API the adapter uses, read from source code: the adapter's, and a vLLM release's.

Two halves, both plain ``ast`` (nothing here imports vllm):

- :func:`adapter_uses` walks the ``relayllm_vllm`` package and lists every vLLM name it
  touches: each ``from vllm... import X``, each attribute it reads off X, off the engine and
  the other vLLM objects it holds (:data:`OBJECT_TYPES`), and the keywords of each call.
- :func:`check` answers, for every use, whether that name exists with that signature in one
  vLLM release, read by core's :class:`relayllm.testing.source.SourceTree` (an installed
  package or a wheel file).

So the list of used names is derived from the adapter, not kept by hand; what is kept by hand
is only which vLLM class a variable of the adapter holds (``engine`` is an ``AsyncLLM``), and
:func:`check` fails on a variable holding a vLLM object that this map does not know.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from relayllm.testing.source import Signature, SourceLayoutError, SourceTree, function_signature

#: Variable (or ``self.`` attribute) names in the adapter -> the vLLM class of their value.
OBJECT_TYPES = {
    "engine": ("vllm.v1.engine.async_llm", "AsyncLLM"),
    "renderer": ("vllm.renderers.base", "BaseRenderer"),
    "config": ("vllm.config.vllm", "VllmConfig"),
    "cache": ("vllm.config.cache", "CacheConfig"),
    "scheduler": ("vllm.config.scheduler", "SchedulerConfig"),
    "current_platform": ("vllm.platforms.interface", "Platform"),
    "model_config": ("vllm.config.model", "ModelConfig"),
    "output": ("vllm.outputs", "RequestOutput"),
    "final": ("vllm.outputs", "RequestOutput"),
    "choice": ("vllm.outputs", "CompletionOutput"),
    "pooled": ("vllm.outputs", "PoolingRequestOutput"),
    # the engine's step stats (relayllm_vllm.metrics)
    "scheduler_stats": ("vllm.v1.metrics.stats", "SchedulerStats"),
    "prefix": ("vllm.v1.metrics.stats", "PrefixCacheStats"),
    "iteration_stats": ("vllm.v1.metrics.stats", "IterationStats"),
    "finished": ("vllm.v1.metrics.stats", "FinishedRequestStats"),
}
#: (class, attribute) -> the vLLM class of the attribute's value, for chains ``a.b.c``.
ATTRIBUTE_TYPES: dict[tuple[str, str], tuple[str, str] | None] = {
    ("AsyncLLM", "renderer"): OBJECT_TYPES["renderer"],
    ("AsyncLLM", "model_config"): OBJECT_TYPES["model_config"],
    ("AsyncLLM", "vllm_config"): OBJECT_TYPES["config"],
    ("VllmConfig", "parallel_config"): ("vllm.config.parallel", "ParallelConfig"),
    ("VllmConfig", "cache_config"): OBJECT_TYPES["cache"],
    ("VllmConfig", "scheduler_config"): ("vllm.config.scheduler", "SchedulerConfig"),
    ("VllmConfig", "structured_outputs_config"): (
        "vllm.config.structured_outputs",
        "StructuredOutputsConfig",
    ),
    ("BaseRenderer", "default_chat_tok_params"): ("vllm.renderers.params", "TokenizeParams"),
    ("BaseRenderer", "default_cmpl_tok_params"): ("vllm.renderers.params", "TokenizeParams"),
    ("PoolingRequestOutput", "outputs"): ("vllm.outputs", "PoolingOutput"),
    ("IterationStats", "prompt_token_stats"): ("vllm.v1.metrics.stats", "PromptTokenStats"),
    ("AsyncLLM", "tokenizer"): None,  # the model's (transformers) tokenizer: not vLLM's
    # Not vLLM's: the check stops here.
    ("PoolingOutput", "data"): None,  # a torch.Tensor
}
#: Local names computed from a vLLM object that hold plain values, not vLLM objects: the
#: sampling keywords (a dict), a classifier's probabilities (floats) and the model's
#: ``id2label`` (transformers' config).
PLAIN_VALUES = frozenset({"kwargs", "probs", "id2label"})


# -- the adapter's side ------------------------------------------------------------------------


@dataclass(frozen=True)
class Use:
    """One vLLM name the adapter touches: ``owner`` then attribute ``path``; for a call, the
    number of positional arguments and the keyword names (``**x`` is checked elsewhere)."""

    site: str  # file:line, for the failure message
    owner: tuple[str, str]  # (module, name): an imported name or the class of a variable
    path: tuple[str, ...] = ()
    positional: int | None = None  # None: not called
    keywords: frozenset[str] = frozenset()
    imported: bool = False  # owner comes from an import (must exist as a module-level name)

    def __str__(self) -> str:
        return ".".join([self.owner[1], *self.path]) + f" ({self.site})"


def adapter_uses(package_dir: Path) -> tuple[list[Use], list[str]]:
    """Every vLLM use in the adapter's modules, and the variables that hold a vLLM object
    :data:`OBJECT_TYPES` does not type (each a problem to fix in this file)."""
    uses: list[Use] = []
    untyped: list[str] = []
    for path in sorted(package_dir.rglob("*.py")):
        if path.parent.name == "_boot":
            continue
        tree = ast.parse(path.read_text("utf-8"))
        if not any(_imports_vllm(node) for node in ast.walk(tree)):
            continue  # variable names like ``config`` mean something else there
        _Walker(path.name, uses, untyped).visit_scope(tree, {})
    return uses, untyped


class _Walker:
    def __init__(self, filename: str, uses: list[Use], untyped: list[str]) -> None:
        self.filename, self.uses, self.untyped = filename, uses, untyped

    def visit_scope(self, scope: ast.AST, outer: dict[str, tuple[str, str]]) -> None:
        """A module or function: its vLLM imports are visible in it and in nested functions."""
        aliases = dict(outer)
        body_nodes = list(_own_nodes(scope))
        for node in body_nodes:
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
                for alias in node.names:
                    aliases[alias.asname or alias.name] = (node.module, alias.name)
                    owner = (node.module, alias.name)
                    self.uses.append(Use(self._site(node), owner, imported=True))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "vllm":
                        aliases[alias.asname or alias.name] = (alias.name, "")
                        parent, _, last = alias.name.rpartition(".")
                        if parent:  # ``import vllm.a.b``: the module must exist
                            self.uses.append(Use(self._site(node), (parent, last), imported=True))
        vllm_valued = self._vllm_valued(body_nodes, aliases)
        parents = {child: parent for parent in body_nodes for child in ast.iter_child_nodes(parent)}
        for node in body_nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.visit_scope(node, aliases)
            elif isinstance(node, (ast.Attribute, ast.Name)) and not isinstance(
                parents.get(node), ast.Attribute
            ):
                self._chain(node, parents.get(node), aliases, vllm_valued)

    def _chain(self, node, parent, aliases, vllm_valued) -> None:
        names: list[str] = []
        root = node
        while isinstance(root, ast.Attribute):
            names.append(root.attr)
            root = root.value
        names.reverse()
        if not isinstance(root, ast.Name):
            return
        if root.id == "self" and names and names[0] in OBJECT_TYPES:
            owner, path, imported = OBJECT_TYPES[names[0]], tuple(names[1:]), False
        elif root.id in aliases:
            module, name = aliases[root.id]
            if not name:  # ``import vllm``: vllm.x is a module attribute
                if not names:
                    return
                owner, path, imported = (module, names[0]), tuple(names[1:]), True
            elif name in OBJECT_TYPES:  # a module-level object (current_platform)
                owner, path, imported = OBJECT_TYPES[name], tuple(names), False
            else:
                owner, path, imported = (module, name), tuple(names), True
        elif root.id in OBJECT_TYPES:
            owner, path, imported = OBJECT_TYPES[root.id], tuple(names), False
        else:
            if root.id in vllm_valued and names:
                self.untyped.append(f"{root.id}.{'.'.join(names)} ({self._site(node)})")
            return
        if not path and not imported and not isinstance(parent, ast.Call):
            return  # the bare variable itself: nothing of vLLM's is looked up
        call = parent if isinstance(parent, ast.Call) and parent.func is node else None
        self.uses.append(
            Use(
                self._site(node),
                owner,
                path,
                positional=None
                if call is None
                else sum(1 for a in call.args if not isinstance(a, ast.Starred)),
                keywords=frozenset()
                if call is None
                else frozenset(k.arg for k in call.keywords if k.arg is not None),
                imported=imported,
            )
        )

    def _vllm_valued(self, nodes, aliases) -> set[str]:
        """Local names bound to something computed from a vLLM name or object."""
        known = set(aliases) | set(OBJECT_TYPES) | {"self"}
        bound: set[str] = set()
        for node in nodes:
            if isinstance(node, (ast.Assign, ast.For, ast.AsyncFor)):
                value = node.value if isinstance(node, ast.Assign) else node.iter
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                mentioned = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
                if mentioned & (known - {"self"}) or any(
                    isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Name)
                    and n.value.id == "self"
                    and n.attr in OBJECT_TYPES
                    for n in ast.walk(value)
                ):
                    for target in targets:
                        elements = target.elts if isinstance(target, ast.Tuple) else [target]
                        bound |= {e.id for e in elements if isinstance(e, ast.Name)}
        return bound - set(OBJECT_TYPES) - {"self"} - PLAIN_VALUES

    def _site(self, node: ast.AST) -> str:
        return f"{self.filename}:{getattr(node, 'lineno', '?')}"


def _own_nodes(scope: ast.AST):
    """Nodes of ``scope`` not inside a nested function or class (those are scopes of their own,
    yielded themselves but not entered)."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


# -- vLLM's side -------------------------------------------------------------------------------


def _refused(signature: Signature, use: Use) -> str | None:
    why = signature.refuses(use.positional or 0, use.keywords)
    return f"{use}: {why}" if why else None


def check(source: SourceTree, uses: list[Use]) -> list[str]:
    """One message per use that the release in ``source`` does not have."""
    problems: list[str] = []
    for use in uses:
        try:
            problem = _check_one(source, use)
        except SourceLayoutError as exc:
            problem = f"{use}: {exc}"
        if problem:
            problems.append(problem)
    return sorted(set(problems))


def _check_one(source: SourceTree, use: Use) -> str | None:
    module, name = use.owner
    if use.imported:
        where, node = source.definition(module, name)
    else:
        where, node = source.find_class(module, name)
    for i, attr in enumerate(use.path):
        if isinstance(node, ast.Module):  # an attribute of a module
            where, node = source.definition(where, attr)
            continue
        if not isinstance(node, ast.ClassDef):
            return f"{use}: {name} is not a class, cannot have .{attr}"
        member = source.member(where, node.name, attr)
        if member is None:
            return f"{use}: {node.name} has no attribute {attr!r}"
        if i == len(use.path) - 1:
            node = member
            break
        if (node.name, attr) not in ATTRIBUTE_TYPES:
            return f"{use}: add the vLLM type of {node.name}.{attr} to ATTRIBUTE_TYPES"
        target = ATTRIBUTE_TYPES[(node.name, attr)]
        if target is None:
            return None  # not a vLLM object: the rest of the chain is another library's
        where, node = source.find_class(*target)
    if use.positional is None:
        return None
    if isinstance(node, ast.ClassDef):
        return _refused(source.constructor(where, node.name), use)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return _refused(function_signature(node, method=bool(use.path)), use)
    return None  # a callable attribute declared without a signature


def _imports_vllm(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] == "vllm"
    return isinstance(node, ast.Import) and any(a.name.split(".")[0] == "vllm" for a in node.names)


__all__ = [
    "ATTRIBUTE_TYPES",
    "OBJECT_TYPES",
    "Use",
    "adapter_uses",
    "check",
]
