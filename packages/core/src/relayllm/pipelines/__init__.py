"""Pipelines from a YAML file: deployments, an input, steps that run in order, an output.

A step is a processor on a named deployment with a ``messages`` / ``prompt`` / ``input``
template whose ``{column}`` placeholders are filled from the row; its answer lands in the
step's ``output_column``, where a later step's template can use it. Several steps may name one
deployment: they share its engine. The deployment block is the only backend-specific part, so
swapping ``backend:``/``options:`` leaves every step as it is.

One module per concern: :mod:`~relayllm.pipelines.spec` (the file's model),
:mod:`~relayllm.pipelines.located` (YAML with line numbers, errors naming file/line/field),
:mod:`~relayllm.pipelines.templates`, :mod:`~relayllm.pipelines.load` (env expansion,
validation), :mod:`~relayllm.pipelines.pipeline` (the validated file and its checks),
:mod:`~relayllm.pipelines.inputs`, :mod:`~relayllm.pipelines.transforms` (per-step row
transforms), :mod:`~relayllm.pipelines.deploy` (deploy, shut down what the run started),
:mod:`~relayllm.pipelines.resume`, :mod:`~relayllm.pipelines.outputs` and
:mod:`~relayllm.pipelines.run` (:func:`run_pipeline`). Importing this package does not import
Ray.
"""

from relayllm.pipelines.deploy import deployed
from relayllm.pipelines.load import load_pipeline, parse_pipeline
from relayllm.pipelines.located import PipelineError
from relayllm.pipelines.pipeline import Pipeline
from relayllm.pipelines.progress import Progress, renamed
from relayllm.pipelines.run import RunProgress, RunSummary, StepStats, run_pipeline
from relayllm.pipelines.spec import InputSpec, OutputSpec, PipelineSpec, StepSpec


def __getattr__(name: str) -> object:
    if name == "RunHooks":
        return renamed(f"{__name__}.RunHooks", "RunProgress", RunProgress)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "InputSpec",
    "OutputSpec",
    "Pipeline",
    "PipelineError",
    "PipelineSpec",
    "Progress",
    "RunProgress",
    "RunSummary",
    "StepSpec",
    "StepStats",
    "deployed",
    "load_pipeline",
    "parse_pipeline",
    "run_pipeline",
]
