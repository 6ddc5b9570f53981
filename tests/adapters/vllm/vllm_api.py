"""The vLLM API the adapter uses, read from source code: the adapter's, and a vLLM release's.

Two halves, both plain ``ast`` (nothing here imports vllm):

- :func:`adapter_uses` walks the ``relayllm_vllm`` package and lists every vLLM name it
  touches: each ``from vllm... import X``, each attribute it reads off X, off the engine and
  the other vLLM objects it holds (:data:`OBJECT_TYPES`), and the keywords of each call.
- :class:`SourceTree` reads one vLLM release (an installed package or a wheel file) and
  :func:`check` answers, for every use, whether that name exists there with that signature.

So the list of used names is derived from the adapter, not kept by hand; what is kept by hand
is only which vLLM class a variable of the adapter holds (``engine`` is an ``AsyncLLM``), and
:func:`check` fails on a variable holding a vLLM object that this map does not know.
"""

from __future__ import annotations

import ast
import importlib.util
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

#: Variable (or ``self.`` attribute) names in the adapter -> the vLLM class of their value.
OBJECT_TYPES = {
    "engine": ("vllm.v1.engine.async_llm", "AsyncLLM"),
    "renderer": ("vllm.renderers.base", "BaseRenderer"),
    "config": ("vllm.config.vllm", "VllmConfig"),
    "cache": ("vllm.config.cache", "CacheConfig"),
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


class SourceLayoutError(LookupError):
    """A name is not where (or not what) the adapter expects."""


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


@dataclass(frozen=True)
class Signature:
    positional: tuple[str, ...]
    keywords: frozenset[str]
    varargs: bool
    varkw: bool

    def problem(self, use: Use) -> str | None:
        extra = sorted(use.keywords - self.keywords) if not self.varkw else []
        if extra:
            return f"{use}: no parameter {', '.join(extra)}"
        if use.positional and not self.varargs and use.positional > len(self.positional):
            return (
                f"{use}: takes {len(self.positional)} positional argument(s), "
                f"called with {use.positional}"
            )
        return None


@dataclass
class SourceTree:
    """The ``.py`` files of one vLLM release: an installed package or a wheel file."""

    root: Path  # the directory holding the ``vllm`` package, or a wheel
    _cache: dict[str, ast.Module] = field(default_factory=dict, repr=False)
    _archive: zipfile.ZipFile | None = field(default=None, repr=False)

    @classmethod
    def installed(cls) -> SourceTree | None:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            return None
        return cls(Path(next(iter(spec.submodule_search_locations))).parent)

    def read(self, relative: str) -> str | None:
        if self.root.is_file():
            if self._archive is None:
                self._archive = zipfile.ZipFile(self.root)
            try:
                return self._archive.read(relative).decode("utf-8")
            except KeyError:
                return None
        path = self.root / relative
        return path.read_text("utf-8") if path.is_file() else None

    def module(self, name: str) -> ast.Module:
        if name not in self._cache:
            base = name.replace(".", "/")
            text = self.read(f"{base}.py")
            if text is None:
                text = self.read(f"{base}/__init__.py")
            if text is None:
                raise SourceLayoutError(f"module {name} not found")
            self._cache[name] = ast.parse(text)
        return self._cache[name]

    def is_package(self, name: str) -> bool:
        return self.read(f"{name.replace('.', '/')}/__init__.py") is not None

    def definition(self, module: str, name: str, _depth: int = 0) -> tuple[str, ast.AST]:
        """Where ``module.name`` is defined (following ``from x import name`` re-exports): a
        class, a function, or an (annotated) assignment at module level. A submodule counts."""
        if _depth > 10:
            raise SourceLayoutError(f"import chain too deep resolving {module}.{name}")
        tree = self.module(module)
        for node in _module_level(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name == name:
                    return module, node
            elif (
                isinstance(node, ast.AnnAssign)
                and _is_name(node.target, name)
                or isinstance(node, ast.Assign)
                and any(_is_name(t, name) for t in node.targets)
            ):
                return module, node
        for node in _module_level(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.definition(self._absolute(module, node), alias.name, _depth + 1)
        if self.is_package(module):
            try:
                return f"{module}.{name}", self.module(f"{module}.{name}")
            except SourceLayoutError:
                pass
        raise SourceLayoutError(f"{name} is not defined in {module}")

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = module if self.is_package(module) else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        return f"{package}.{node.module}" if node.module else package

    def find_class(self, module: str, name: str) -> tuple[str, ast.ClassDef]:
        where, node = self.definition(module, name)
        if not isinstance(node, ast.ClassDef):
            raise SourceLayoutError(f"{module}.{name} is not a class")
        return where, node

    def mro(self, module: str, name: str):
        """The class and its bases defined in vLLM, nearest first (bases from elsewhere --
        msgspec.Struct, ABC, Generic[...] -- are skipped)."""
        seen, todo = set(), [self.find_class(module, name)]
        while todo:
            where, node = todo.pop(0)
            if (where, node.name) in seen:
                continue
            seen.add((where, node.name))
            yield where, node
            for base in node.bases:
                base = base.value if isinstance(base, ast.Subscript) else base
                if isinstance(base, ast.Name):
                    try:
                        todo.append(self.find_class(where, base.id))
                    except SourceLayoutError:
                        pass

    def member(self, module: str, cls: str, name: str) -> ast.AST | None:
        """The definition of ``cls.name``: a method or property, a class attribute or field, an
        enum member, or a ``self.name = ...`` in a method; None if there is none."""
        for _, klass in self.mro(module, cls):
            for item in klass.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                    return item
                if isinstance(item, ast.AnnAssign) and _is_name(item.target, name):
                    return item
                if isinstance(item, ast.Assign) and any(_is_name(t, name) for t in item.targets):
                    return item
            for sub in ast.walk(klass):
                if isinstance(sub, (ast.Assign, ast.AnnAssign)):
                    targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                    for target in targets:
                        if (
                            isinstance(target, ast.Attribute)
                            and target.attr == name
                            and isinstance(target.value, ast.Name)
                            and target.value.id == "self"
                        ):
                            return sub
        return None

    def fields(self, module: str, cls: str) -> set[str]:
        """Annotated, non-ClassVar, public class attributes over the MRO (dataclass, pydantic
        dataclass and msgspec fields)."""
        names: set[str] = set()
        for _, klass in self.mro(module, cls):
            for item in klass.body:
                if (
                    isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and not item.target.id.startswith("_")
                    and "ClassVar" not in ast.unparse(item.annotation)
                ):
                    names.add(item.target.id)
        return names

    def constructor(self, module: str, cls: str) -> Signature:
        """How ``cls(...)`` is called: its ``__init__`` if a class in the MRO defines one,
        else its fields as keywords (a dataclass)."""
        init = self.member(module, cls, "__init__")
        if isinstance(init, ast.FunctionDef):
            return function_signature(init, method=True)
        fields = self.fields(module, cls)
        return Signature(tuple(fields), frozenset(fields), False, False)

    def field_default(self, module: str, cls: str, name: str):
        """The literal default of field ``cls.name`` (``x: float = 0.9`` or
        ``x: float = Field(default=0.9, ...)``)."""
        node = self.member(module, cls, name)
        if not isinstance(node, ast.AnnAssign) or node.value is None:
            raise SourceLayoutError(f"{cls}.{name} has no default")
        value = node.value
        if isinstance(value, ast.Call):
            value = next((k.value for k in value.keywords if k.arg == "default"), None)
        return ast.literal_eval(value)


def function_signature(node: ast.FunctionDef | ast.AsyncFunctionDef, *, method: bool) -> Signature:
    args = node.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    static = any(_is_name(d, "staticmethod") for d in node.decorator_list)
    if method and not static and positional:
        positional = positional[1:]  # self / cls
    keywords = {a.arg for a in args.args + args.kwonlyargs} - {"self", "cls"}
    return Signature(
        tuple(positional), frozenset(keywords), args.vararg is not None, args.kwarg is not None
    )


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
        return source.constructor(where, node.name).problem(use)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return function_signature(node, method=bool(use.path)).problem(use)
    return None  # a callable attribute declared without a signature


def _imports_vllm(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] == "vllm"
    return isinstance(node, ast.Import) and any(a.name.split(".")[0] == "vllm" for a in node.names)


def _module_level(tree: ast.Module):
    """Module-level statements, including those under ``if``/``try`` (TYPE_CHECKING, fallbacks)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.If):
            todo.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            todo.extend(node.body + node.orelse + [s for h in node.handlers for s in h.body])
        else:
            yield node


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


__all__ = [
    "ATTRIBUTE_TYPES",
    "OBJECT_TYPES",
    "Signature",
    "SourceLayoutError",
    "SourceTree",
    "Use",
    "adapter_uses",
    "check",
    "function_signature",
]
