"""The ``deployments:`` section of a YAML file, alone: what ``relayllm batch --config`` and
:func:`relayllm.run_batch_file` start. A file that declares only deployments is enough; a
pipeline file works too, and its other sections (the pipeline's) are not read here. Errors
name the file, the line and the field, as a pipeline file's do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relayllm.configbase import error_message, flat_errors
from relayllm.deployments.config import DeploymentConfig, resolve
from relayllm.errors import ConfigError, RelayLLMError
from relayllm.pipelines.load import data_loc, expand_env
from relayllm.pipelines.located import Loc, Located, not_utf8, parse_yaml
from relayllm.pipelines.pipeline import deployment_problems
from relayllm.pipelines.spec import PipelineSpec

SECTION = "deployments"


class _Deployments(BaseModel):
    model_config = ConfigDict(extra="ignore")  # the pipeline's sections: checked there

    deployments: list[DeploymentConfig] = Field(min_length=1)


@dataclass(frozen=True)
class DeploymentsFile:
    source: str
    deployments: list[DeploymentConfig]
    located: Located

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.deployments]

    def check_backends(self) -> None:
        """Every backend installed and its options valid (no cluster needed)."""
        problems: list[tuple[Loc, str]] = []
        for i, config in enumerate(self.deployments):
            try:
                resolve(config)
            except RelayLLMError as exc:  # not installed, unknown backend, bad options
                problems.extend(deployment_problems(exc, i, config))
        if problems:
            raise self.located.error(problems)


def load_deployments(path: str | os.PathLike[str]) -> DeploymentsFile:
    """Read and validate the ``deployments:`` of a file; no cluster, no engine."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise not_utf8(source, exc) from None
    located = parse_yaml(text, source)
    data = located.data
    if not isinstance(data, dict) or SECTION not in data:
        raise located.error([((), "the file must be a mapping with a 'deployments:' list")])
    unknown = sorted(set(data) - set(PipelineSpec.model_fields))
    problems: list[tuple[Loc, str]] = [((key,), "unknown key") for key in unknown]
    section = {SECTION: expand_env(data[SECTION], (SECTION,), problems)}
    if problems:
        raise located.error(problems)
    try:
        deployments = _Deployments.model_validate(section).deployments
    except ValidationError as exc:
        raise located.error(
            [
                (data_loc(e["loc"], section), error_message(PipelineSpec, e))
                for e in flat_errors(exc)
            ]
        ) from None
    names = [d.name for d in deployments]
    twice: list[tuple[Loc, str]] = [
        ((SECTION, i, "name"), f"deployment {name!r} is declared twice")
        for i, name in enumerate(names)
        if names.index(name) != i
    ]
    if twice:
        raise located.error(twice)
    return DeploymentsFile(source, deployments, located)


__all__ = ["DeploymentsFile", "load_deployments"]
