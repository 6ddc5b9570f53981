"""``relayllm check FILE``: validate a pipeline, deployments or batch file without running
anything (no Ray, no engine), and the one reader of a YAML file that declares deployments
(``deploy`` takes a pipeline file or one with only ``deployments:``, as ``serve`` does)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

from relayllm.cli.common import handle_errors

if TYPE_CHECKING:
    from relayllm.deployments.file import DeploymentsFile

#: The sections that make a YAML file a pipeline (a deployments file has none of them).
PIPELINE_SECTIONS = ("input", "steps", "output")


def load_declared(path: str, inputs: bool = True) -> tuple[DeploymentsFile, str]:
    """The deployments ``path`` declares, every backend checked, and what the file is: a
    pipeline (checked whole: steps, templates, and its input files unless ``inputs`` is
    False -- ``deploy`` starts engines only, before the input may exist) or a deployments
    file."""
    from relayllm.deployments.file import load_deployments
    from relayllm.pipelines import load_pipeline

    declared = load_deployments(path)
    data = declared.located.data
    if isinstance(data, dict) and any(key in data for key in PIPELINE_SECTIONS):
        pipeline = load_pipeline(path)
        pipeline.check_backends()
        if inputs and pipeline.spec.input.path:
            pipeline.input_paths()
        steps = ", ".join(step.name for step in pipeline.spec.steps)
        return declared, f"a pipeline: {len(pipeline.spec.steps)} step(s) ({steps})"
    declared.check_backends()
    return declared, "a deployments file"


def describe_batch_file(path: str) -> str:
    """A batch input file read as ``relayllm batch`` reads it: duplicate custom_ids and a file
    with no request are errors; lines that cannot run are counted (a run writes them to the
    errors file)."""
    from relayllm.batch.scan import scan_batch_file

    scan = scan_batch_file(path)
    routes = sorted({str(model) for model, _ in scan.keys if model is not None})
    said = f"a batch file: {scan.lines} request line(s)"
    if routes:
        said += f", models {', '.join(routes)}"
    if scan.bad:
        lines = ", ".join(str(bad.line) for bad in scan.bad[:10])
        said += f"; {len(scan.bad)} line(s) cannot run and would go to the errors file: {lines}"
    return said


@click.command()
@click.argument("files", metavar="FILE...", nargs=-1, required=True, type=click.Path())
@handle_errors
def check(files):
    """Validate pipeline, deployments and batch files without running anything: no Ray
    cluster, no engine. YAML files are read as `relayllm run` or `deploy` reads them (every
    field, template, input file and backend option); .jsonl files as `relayllm batch` does.
    Exits 0 when every file is valid, 2 at the first that is not, with the file, line and
    field.

    \b
    Examples:
      relayllm check examples/questions.yaml
      relayllm check examples/batch/requests.jsonl examples/echo.yaml
    """
    for path in files:
        if not os.path.isfile(path):
            from relayllm.errors import ConfigError

            raise ConfigError(f"{path}: no such file")
        if path.endswith(".jsonl"):
            said = describe_batch_file(path)
        else:
            declared, kind = load_declared(path)
            said = f"{kind}; deployments {', '.join(declared.names)}"
        click.echo(f"{path}: ok, {said}")
