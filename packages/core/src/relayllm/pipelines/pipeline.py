"""A validated pipeline file (:class:`Pipeline`, made by :mod:`~relayllm.pipelines.load`) and
its checks that need more than the file's keys: backends installed and serving every step, input
paths readable, template columns present. Every error names the file, the line and the field."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

from relayllm.adapters.options import OptionsError
from relayllm.deployments import DeploymentConfig
from relayllm.errors import (
    ConfigError,
    MissingDependencyError,
    RelayLLMError,
    UnknownBackendError,
)
from relayllm.pipelines.located import Loc, Located, PipelineError
from relayllm.pipelines.spec import EXTENSIONS, PipelineSpec
from relayllm.pipelines.templates import step_templates, template_fields
from relayllm.plugin.manager import get_registry
from relayllm.rows import features_of, unsupported_features


@dataclass
class Pipeline:
    """A validated pipeline file. Input paths in it are relative to the file's directory, the
    output path to the current directory (the command's)."""

    spec: PipelineSpec
    source: str
    base_dir: Path
    located: Located

    def error(self, loc: Loc, message: str) -> PipelineError:
        return self.located.error([(loc, message)])

    def deployment(self, name: str) -> DeploymentConfig:
        return next(d for d in self.spec.deployments if d.name == name)

    def check_backends(self) -> None:
        """Backends installed, options valid, every step's task served. No cluster needed."""
        from relayllm.deployments import resolve, unserved_task_message

        problems: list[tuple[Loc, str]] = []
        for i, config in enumerate(self.spec.deployments):
            try:
                backend, options = resolve(config)
            except MissingDependencyError as exc:
                # The engine is not installed here (a GPU engine checked on a laptop, say): say
                # so, and still check what the steps ask of the valid options (no engine needed).
                problems.extend(deployment_problems(exc, i, config))
                backend = get_registry().get(config.backend)
                options = backend.parse_options(config.options)
            except RelayLLMError as exc:  # bad options, unknown backend
                problems.extend(deployment_problems(exc, i, config))
                continue
            served = backend.tasks_for(options)
            supported = backend.features_for(options)
            for j, step in enumerate(self.spec.steps):
                if step.deployment != config.name:
                    continue
                if step.resolved_task not in served:
                    problems.append(
                        (
                            ("steps", j, "task"),
                            unserved_task_message(
                                config.name, config.backend, step.resolved_task, served
                            ),
                        )
                    )
                params = step.processor_config().sampling_params
                problem = unsupported_features(config.backend, features_of(params), supported)
                if problem:
                    problems.append((("steps", j, "sampling_params"), problem))
        if problems:
            raise self.located.error(problems)

    def input_paths(self, override: str | None = None) -> list[str]:
        """The input files, checked to exist and be readable (remote URIs are left to Ray)."""
        raw = [override] if override else self.spec.input.path
        raw = [raw] if isinstance(raw, str) else list(raw or [])
        base = Path.cwd() if override else self.base_dir
        loc: Loc = ("input", "path")
        where = "--input" if override else None  # an option's error names the option
        paths: list[str] = []
        for entry in raw:
            if "://" in entry:
                paths.append(entry)
                continue
            full = entry if os.path.isabs(entry) else str(base / entry)
            if glob.has_magic(full):
                matches = sorted(glob.glob(full))
                if not matches:
                    raise self._input_error(where, loc, f"no file matches {entry!r}")
                paths.extend(matches)
            elif not os.path.exists(full):
                raise self._input_error(where, loc, f"{entry!r} does not exist (looked at {full})")
            else:
                paths.append(full)
        for path in paths:
            if "://" not in path and not os.access(path, os.R_OK):
                raise self._input_error(where, loc, f"{path} is not readable")
        return paths

    def _input_error(self, where: str | None, loc: Loc, message: str) -> ConfigError:
        return ConfigError(f"{where}: {message}") if where else self.error(loc, message)

    def input_format(self, paths: list[str]) -> str:
        if self.spec.input.format:
            return self.spec.input.format
        for path in paths:
            candidates = [path] if not os.path.isdir(path) else sorted(os.listdir(path))
            for name in candidates:
                fmt = EXTENSIONS.get(Path(name).suffix.lower())
                if fmt:
                    return fmt
        raise self.error(
            ("input", "path"), "cannot tell the format from the file names; set input.format"
        )

    def check_columns(self, columns: list[str] | None) -> None:
        """Every placeholder names an input column or an earlier step's output column."""
        problems: list[tuple[Loc, str]] = []
        if columns == []:
            source = "input.rows" if self.spec.input.rows is not None else "the input file"
            raise self.error(("input",), f"{source} has no rows (an empty file?): nothing to run")
        id_column = self.spec.input.id_column
        if columns is not None and id_column and id_column not in columns:
            problems.append(
                (
                    ("input", "id_column"),
                    f"column {id_column!r} is not in the input (columns: {', '.join(columns)})",
                )
            )
        known = set(columns) if columns is not None else None
        for i, step in enumerate(self.spec.steps):
            for loc, template in step_templates(step, ("steps", i)):
                for name in template_fields(template):
                    if known is not None and name not in known:
                        problems.append(
                            (
                                loc,
                                f"column {name!r} is not in the input (columns: "
                                f"{', '.join(columns or [])}) nor an earlier step's output_column",
                            )
                        )
            if known is not None:
                known.add(step.output_column)
        if problems:
            raise self.located.error(problems)


def deployment_problems(exc: Exception, i: int, config: DeploymentConfig) -> list[tuple[Loc, str]]:
    """Deployment ``i``'s failed check (bad options, unknown backend, engine missing) as
    problems at the fields of the file they concern."""
    loc: Loc = ("deployments", i)
    if isinstance(exc, OptionsError):  # the backend's Options model: name each field
        return [
            ((*loc, "options", *where), f"{why} (backend {config.backend!r})")
            for where, why in exc.problems
        ]
    option = getattr(exc, "option", None)  # a backend's check that names one option
    if isinstance(option, str):
        return [((*loc, "options", option), str(exc))]
    key = (
        "backend" if isinstance(exc, UnknownBackendError) or "option" not in str(exc) else "options"
    )
    return [((*loc, key), str(exc))]


__all__ = ["Pipeline", "deployment_problems"]
