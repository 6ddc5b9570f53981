"""Read sglang's API from its source code, without importing it.

Importing sglang pulls in a CUDA torch and takes seconds, and the machine that validates a config
(the driver) often has no GPU. The names we need -- ServerArgs fields, SamplingParams fields,
the parameters of ``Engine`` methods -- are plain declarations, so we read them with ``ast``.
The same reader checks a user's ``server_args`` at deploy time and, in CI, checks the adapter
against the released wheel (the API contract test), so one tested piece of code does both.
"""

from __future__ import annotations

import ast
import importlib.util
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ENGINE_MODULE = "sglang"  # where users (and the adapter) get ``Engine`` from
SERVER_ARGS_MODULE = "sglang.srt.server_args"
SAMPLING_PARAMS_MODULE = "sglang.srt.sampling.sampling_params"
REASONING_PARSER_MODULE = "sglang.srt.parser.reasoning_parser"


class SourceLayoutError(LookupError):
    """The sglang source does not have the shape this reader expects (a new release?)."""


@dataclass
class SourceTree:
    """The ``.py`` files of one sglang release: an installed package or a wheel file."""

    root: Path  # the directory holding the ``sglang`` package, or a wheel
    _cache: dict[str, ast.Module] = field(default_factory=dict, repr=False)
    _archive: zipfile.ZipFile | None = field(default=None, repr=False)

    @classmethod
    def installed(cls) -> SourceTree | None:
        """The installed sglang (found, not imported), or None."""
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            return None
        return cls(Path(next(iter(spec.submodule_search_locations))).parent)

    @classmethod
    def wheel(cls, path: str | Path) -> SourceTree:
        return cls(Path(path))

    def _read(self, relative: str) -> str | None:
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
        """The parsed source of module ``name`` (``a.b`` -> ``a/b.py`` or ``a/b/__init__.py``)."""
        if name not in self._cache:
            base = name.replace(".", "/")
            text = self._read(f"{base}.py")
            if text is None:
                text = self._read(f"{base}/__init__.py")
            if text is None:
                raise SourceLayoutError(f"module {name} not found in {self.root}")
            self._cache[name] = ast.parse(text)
        return self._cache[name]

    def is_package(self, name: str) -> bool:
        return self._read(f"{name.replace('.', '/')}/__init__.py") is not None

    # -- names -------------------------------------------------------------------------------

    def resolve(
        self, module: str, name: str, _depth: int = 0
    ) -> tuple[str, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef]:
        """Where ``module.name`` is defined: follows ``from x import name`` and sglang's
        ``name = LazyImport("x", "name")`` re-exports."""
        if _depth > 10:
            raise SourceLayoutError(f"import chain too deep resolving {module}.{name}")
        tree = self.module(module)
        for node in tree.body:
            if (
                isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and node.name == name
            ):
                return module, node
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = self._absolute(module, node)
                        return self.resolve(source, alias.name, _depth + 1)
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets
            ):
                call = node.value
                if (
                    isinstance(call, ast.Call)
                    and len(call.args) >= 2
                    and all(
                        isinstance(a, ast.Constant) and isinstance(a.value, str)
                        for a in call.args[:2]
                    )
                ):  # Engine = LazyImport("sglang.srt.entrypoints.engine", "Engine")
                    return self.resolve(call.args[0].value, call.args[1].value, _depth + 1)
        raise SourceLayoutError(f"{name} is not defined in {module}")

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = module if self.is_package(module) else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        return f"{package}.{node.module}" if node.module else package

    def find_class(self, module: str, name: str) -> tuple[str, ast.ClassDef]:
        where, node = self.resolve(module, name)
        if not isinstance(node, ast.ClassDef):
            raise SourceLayoutError(f"{module}.{name} is not a class")
        return where, node

    def _classes(self, module: str, cls: ast.ClassDef):
        """``cls`` and its bases that are defined in sglang (a simple walk of the MRO)."""
        seen, todo = set(), [(module, cls)]
        while todo:
            where, node = todo.pop(0)
            if (where, node.name) in seen:
                continue
            seen.add((where, node.name))
            yield where, node
            for base in node.bases:
                if isinstance(base, ast.Name):
                    try:
                        todo.append(self.find_class(where, base.id))
                    except SourceLayoutError:
                        pass  # a base from outside sglang (msgspec.Struct, ABC...)

    # -- what the adapter asks ---------------------------------------------------------------

    def method_parameters(self, module: str, cls: str, method: str) -> tuple[set[str], bool]:
        """Keyword-passable parameter names of ``cls.method`` and whether it takes ``**kwargs``."""
        where, node = self.find_class(module, cls)
        for _, klass in self._classes(where, node):
            for item in klass.body:
                if (
                    isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and item.name == method
                ):
                    args = item.args
                    names = {a.arg for a in args.args + args.kwonlyargs} - {"self", "cls"}
                    return names, args.kwarg is not None
        raise SourceLayoutError(f"{cls}.{method} not found in {module}")

    def members(self, module: str, cls: str) -> set[str]:
        """Methods, class attributes and ``self.x = ...`` attributes of ``cls`` (and its bases)."""
        where, node = self.find_class(module, cls)
        names: set[str] = set()
        for _, klass in self._classes(where, node):
            for item in klass.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
            for sub in ast.walk(klass):
                if isinstance(sub, (ast.Assign, ast.AnnAssign)):
                    targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                    for target in targets:
                        for t in ast.walk(target):
                            if (
                                isinstance(t, ast.Attribute)
                                and isinstance(t.value, ast.Name)
                                and t.value.id == "self"
                            ):
                                names.add(t.attr)
        return names

    def struct_fields(self, module: str, cls: str) -> set[str]:
        """Declared fields (annotated class attributes) of a dataclass/msgspec-style class."""
        where, node = self.find_class(module, cls)
        fields: set[str] = set()
        for _, klass in self._classes(where, node):
            fields |= _annotated_fields(klass)
        return fields

    def server_args_fields(self) -> set[str]:
        """Every field ``ServerArgs`` accepts.

        In 0.5.x ServerArgs is assembled at import time from namespace classes listed in
        ``_INPUT_NAMESPACES`` (model, parallel, schedule, ...); earlier releases declared the
        fields on the class itself. Both shapes are read.
        """
        where, node = self.find_class(SERVER_ARGS_MODULE, "ServerArgs")
        fields = _annotated_fields(node)
        for statement in self.module(where).body:
            targets = (
                statement.targets
                if isinstance(statement, ast.Assign)
                else ([statement.target] if isinstance(statement, ast.AnnAssign) else [])
            )
            if any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in targets):
                for element in getattr(statement.value, "elts", []):
                    if isinstance(element, ast.Name):
                        fields |= self.struct_fields(where, element.id)
        if not fields:
            raise SourceLayoutError(f"no ServerArgs fields found in {where}")
        return fields

    def sampling_param_fields(self) -> set[str]:
        """Names ``SamplingParams`` accepts (fields, or ``__init__`` parameters in old releases)."""
        fields = {f for f in self.struct_fields(SAMPLING_PARAMS_MODULE, "SamplingParams")}
        if not fields:
            fields, _ = self.method_parameters(SAMPLING_PARAMS_MODULE, "SamplingParams", "__init__")
        if not fields:
            raise SourceLayoutError("no SamplingParams fields found")
        return fields

    def reasoning_parsers(self) -> dict[str, str]:
        """The names ``ReasoningParser`` accepts, each with the detector class it builds: its
        ``DetectorMap`` registry."""
        _, node = self.find_class(REASONING_PARSER_MODULE, "ReasoningParser")
        for item in node.body:
            targets: list[ast.expr]
            if isinstance(item, ast.AnnAssign):
                targets, value = [item.target], item.value
            elif isinstance(item, ast.Assign):
                targets, value = item.targets, item.value
            else:
                continue
            if isinstance(value, ast.Dict) and any(
                isinstance(t, ast.Name) and t.id == "DetectorMap" for t in targets
            ):
                parsers = {
                    k.value: ast.unparse(v)
                    for k, v in zip(value.keys, value.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                }
                if parsers:
                    return parsers
        raise SourceLayoutError("no ReasoningParser.DetectorMap of parser names found")

    def reasoning_parser_names(self) -> set[str]:
        """The names ``ReasoningParser`` accepts (``--reasoning-parser``'s choices)."""
        return set(self.reasoning_parsers())

    def string_dict_keys(self, module: str) -> set[str]:
        """String keys of dict literals in ``module`` (e.g. the ``meta_info`` sglang returns)."""
        keys: set[str] = set()
        for node in ast.walk(self.module(module)):
            if isinstance(node, ast.Dict):
                keys.update(
                    k.value
                    for k in node.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                )
        return keys

    def dict_values_for_key(self, module: str, key: str) -> set[str]:
        """String values paired with ``key`` in dict literals (e.g. finish-reason ``"type"``)."""
        values: set[str] = set()
        for node in ast.walk(self.module(module)):
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values, strict=True):
                    if (
                        isinstance(k, ast.Constant)
                        and k.value == key
                        and isinstance(v, ast.Constant)
                        and isinstance(v.value, str)
                    ):
                        values.add(v.value)
        return values


def _annotated_fields(klass: ast.ClassDef) -> set[str]:
    fields = set()
    for item in klass.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            name = item.target.id
            if name.startswith("_") or "ClassVar" in ast.unparse(item.annotation):
                continue
            fields.add(name)
    return fields


__all__ = [
    "ENGINE_MODULE",
    "REASONING_PARSER_MODULE",
    "SAMPLING_PARAMS_MODULE",
    "SERVER_ARGS_MODULE",
    "SourceLayoutError",
    "SourceTree",
]
