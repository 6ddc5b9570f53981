"""The Ray Data job of a scanned batch file (:mod:`relayllm.batch.scan`):
:func:`run_scanned` runs each (deployment, task) group as one job. A read task per chunk reads
its byte range from disk and keeps its group's lines as rows of one canonical schema (``line``
int64, ``text`` the line's JSON as a string), so every block concatenates with every other
whatever the bodies hold. The stage's ``preprocess`` parses the line inside the stage worker
(:func:`relayllm.batch.format.parse_line`), its ``postprocess`` renders the output line there;
the driver only writes the finished blocks' lines, in input order, and flushes each block.
Scoring lines are rows of pairs (:mod:`relayllm.batch.pairs`); a stop
(:mod:`relayllm.batch.stop`) is asked before each line is sent."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from relayllm.batch.format import BadLine, BatchRequest, parse_envelope, parse_line, route_models
from relayllm.batch.output import (
    error_line,
    model_not_found_line,
    request_counts,
    response_line,
    served_model,
)
from relayllm.batch.pairs import ScoreWriter, StopPairs, pair_rows, score_schema
from relayllm.batch.scan import Done, Scan
from relayllm.rows import (
    ERROR,
    INPUT_COLUMN,
    NUM_GENERATED_TOKENS,
    NUM_INPUT_TOKENS,
    SAMPLING_PARAMS_COLUMN,
    Task,
)

if TYPE_CHECKING:
    from ray.data import Dataset

    from relayllm.batch.stop import StopCheck

#: The label every Ray node carries with its id (what pins a task to one node).
NODE_ID_LABEL = "ray.io/node-id"


def groups_of(
    scan: Scan, deployments: list[str], default: str | None, strict: bool = True
) -> dict[tuple[str, Task], list[int]]:
    """The (deployment, task) groups to run, in the file's order, each with its key indexes
    (``strict=False``: the keys whose model routes nowhere are left out)."""
    to = route_models(scan.first_line, deployments, default, strict)
    groups: dict[tuple[str, Task], list[int]] = {}
    for index, (model, task) in enumerate(scan.keys):
        if model in to:
            groups.setdefault((to[model], task), []).append(index)
    return groups


def run_scanned(
    scan: Scan,
    deployments: list[str],
    default: str | None,
    output: IO[str],
    errors: IO[str],
    processor_fields: dict[str, Any] | None = None,
    done: Done | None = None,
    on_block: Callable[[int, int], None] | None = None,
    stop: StopCheck | None = None,
    strict_routing: bool = True,
    tokens: dict[str, dict[str, int]] | None = None,
) -> dict[str, int]:
    """Run the scanned file's groups one after another; write each line to ``output`` or
    ``errors`` as its block arrives; return OpenAI's ``request_counts`` for the whole file
    (a resumed run's earlier lines included).

    ``on_block(completed, failed)`` is called after each block is written and flushed (the
    counts so far, earlier runs' lines included); an exception it raises stops the run there,
    every line written so far kept (the batch service's cancel and expiry).

    ``stop`` (:class:`StopCheck`) is asked by the stage workers before each line is sent:
    once it says stop, a block's remaining lines are not sent and not written (so a resumed
    or expired run finds them undone), and ``on_block`` must then raise to end the run.

    ``strict_routing=False`` (the batch service): a line whose ``model`` names no deployment
    is written to ``errors`` as a 404 ``model_not_found`` response, the other lines run (by
    default such a file is refused before anything runs, :func:`route_models`).

    ``tokens``, when given, gets each deployment's ``prompt_tokens`` and ``completion_tokens``
    summed over the output lines this run wrote (the lines' own ``usage``; scoring lines
    excepted)."""
    from relayllm.data_context import keep_input_order

    done = done or Done()
    keep_input_order()  # before any dataset exists: each keeps the context it was made with
    completed, failed = done.completed, done.failed
    for line in scan.bad:
        errors.write(
            json.dumps(error_line(line.line, line.custom_id, line.code, line.message)) + "\n"
        )
        failed += 1
    groups = groups_of(scan, deployments, default, strict_routing)
    routed = {k for keys in groups.values() for k in keys}
    unrouted = [k for k in range(len(scan.keys)) if k not in routed]
    if unrouted:
        failed += _write_unrouted(scan, unrouted, deployments, errors)
    errors.flush()
    if unrouted and on_block is not None:
        on_block(completed, failed)
    for (deployment, task), keys in groups.items():
        dataset = group_dataset(scan, keys, deployment, task, processor_fields or {}, stop)
        keep_input_order(dataset.context)
        write = ScoreWriter(deployment, served_model(deployment)) if task == "score" else None
        for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
            if write is not None:
                ok, bad, skipped = write(batch.to_pylist(), output, errors)  # type: ignore[union-attr]
            else:
                ok, bad, skipped = write_block(batch, output, errors)
                if tokens is not None:
                    add_tokens(tokens.setdefault(deployment, {}), batch)
            completed, failed = completed + ok, failed + bad
            output.flush()  # each block reaches the disk as it finishes: a kill keeps it
            errors.flush()
            if on_block is not None:
                on_block(completed, failed)
            if skipped:  # lines left undone: only a run that ends here may leave them
                raise RuntimeError(
                    f"{skipped} lines were stopped before they ran and on_block did not end "
                    f"the run; it ends here (the lines not written are not done)"
                )
    return request_counts(scan.lines, completed, failed)


def _write_unrouted(scan: Scan, keys: list[int], deployments: list[str], errors: IO[str]) -> int:
    """The lines of ``keys`` (models that route nowhere) as error lines, read from the file's
    chunks in the driver, a chunk at a time; returns how many."""
    wanted, written = set(keys), 0
    with open(scan.path, "rb") as handle:
        for chunk in scan.chunks:
            if not wanted.intersection(chunk.keys):
                continue
            handle.seek(chunk.start)
            data = handle.read(chunk.end - chunk.start)
            for i, (key, raw) in enumerate(zip(chunk.keys, data.split(b"\n"), strict=False)):
                if key not in wanted:
                    continue
                number = chunk.first_line + i
                model = scan.keys[key][0]
                envelope = parse_envelope(raw.decode("utf-8"), number)
                line = model_not_found_line(number, envelope.custom_id, model, deployments)
                errors.write(encode(line) + "\n")
                written += 1
    return written


def group_dataset(
    scan: Scan,
    keys: list[int],
    deployment: str,
    task: Task,
    fields: dict[str, Any],
    stop: StopCheck | None = None,
) -> Dataset:
    """One group's lines as a lazy dataset: read from disk chunk by chunk, through the stage."""
    import ray

    from relayllm.config import ProcessorConfig
    from relayllm.fit import TASK_NUM_CPUS
    from relayllm.processor import build_processor

    wanted = bytes(keys)
    chunks = [
        {"start": c.start, "end": c.end, "first_line": c.first_line, "keys": bytes(c.keys)}
        for c in scan.chunks
        if any(k in c.keys for k in wanted)
    ]
    items = ray.data.from_items(chunks, override_num_blocks=max(len(chunks), 1))
    reader = ReadChunk(scan.path, wanted, task)
    # Ray Data names the operator (and its progress bar) after the function.
    reader.__name__ = f"read[{os.path.basename(scan.path)}]"  # type: ignore[attr-defined]
    lines = items.map_batches(
        reader,
        batch_size=1,  # a chunk per call: one block of its lines
        batch_format="pyarrow",
        num_cpus=TASK_NUM_CPUS,  # a whole CPU each could starve next to an engine replica
        # One read task at a time: a chunk takes milliseconds to read, and at 0.1 CPU each
        # Ray would start a worker process per concurrent task (a second of imports each):
        # unbounded, the reads cost more CPU than the stage (benchmarks/batch_file.py).
        concurrency=1,
        # On the node of this process (the driver of `relayllm batch`, the service's runner on
        # the head node): the file is on its disk, not necessarily on the other nodes'.
        # (A label selector, as Ray Data's own reads of local files pin them: the scheduling
        # strategy argument is deprecated and warns on the user's console.)
        label_selector={NODE_ID_LABEL: ray.get_runtime_context().get_node_id()},
    )
    # No more stage actors than blocks: an actor with no block to work on idles.
    fields = {**fields, "concurrency": min(fields.get("concurrency", 1), max(len(chunks), 1))}
    config = ProcessorConfig(deployment=deployment, task=task, **fields)
    if task == "score":  # the read task built the pair rows; the driver gathers them
        return build_processor(config, StopPairs(stop) if stop is not None else None)(lines)
    served = served_model(deployment)
    return build_processor(config, Parse(task, stop), Respond(deployment, served))(lines)


class ReadChunk:
    """Read task: a chunk's byte range from disk, its group's lines as rows."""

    def __init__(self, path: str, keys: bytes, task: Task) -> None:
        self.path, self.keys, self.task = path, set(keys), task

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        (chunk,) = batch.to_pylist()
        with open(self.path, "rb") as handle:
            handle.seek(chunk["start"])
            data = handle.read(chunk["end"] - chunk["start"])
        lines, texts = [], []
        # Split as the scan's binary line iteration did: on b"\n" only.
        for i, (key, raw) in enumerate(zip(chunk["keys"], data.split(b"\n"), strict=False)):
            if key in self.keys:
                lines.append(chunk["first_line"] + i)
                texts.append(raw.decode("utf-8"))
        if self.task == "score":
            return pa.Table.from_pylist(
                [
                    row
                    for line, text in zip(lines, texts, strict=True)
                    for row in pair_rows(line, text)
                ],
                schema=score_schema(),
            )
        return pa.table({"line": pa.array(lines, pa.int64()), "text": pa.array(texts, pa.string())})


class Parse:
    """``preprocess`` in the stage actor: a line's JSON into the task's input columns; a bad
    line keeps its error line and no input (the stage sends nothing for it). The checks the
    stage makes on every row anyway are not made twice (``parse_line(check=False)``)."""

    def __init__(self, task: Task, stop: StopCheck | None = None) -> None:
        self.column = INPUT_COLUMN[task]
        self.stop = stop

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        line = row["line"]
        if self.stop is not None and self.stop():
            return {"line": line, "skip": True, self.column: None}  # not sent, not written
        request = parse_line(row["text"], line, check=False)
        if isinstance(request, BadLine):
            bad = error_line(request.line, request.custom_id, request.code, request.message)
            return {"line": line, "bad": bad, self.column: None}
        return {
            "line": line,
            "text": row["text"],
            "request": request,
            self.column: request.value,
            SAMPLING_PARAMS_COLUMN: request.sampling_params or None,
        }


#: A row error the stage's image check wrote (``relayllm.stage.images.prepare_images``): the
#: line's image was refused or unreadable before anything was sent, not the engine's failure.
_IMAGE_ERROR = re.compile(r"messages\[\d+\]\.content\[\d+\]\.image_url\b")
#: One encoder for every line (json.dumps with options builds one per call).
encode = json.JSONEncoder(ensure_ascii=False).encode


#: What an error line or a line not sent adds to its deployment's tokens (every row of a block
#: has the same columns).
NO_TOKENS = {"prompt_tokens": 0, "completion_tokens": 0}


class Respond:
    """``postprocess`` in the stage actor: the row's output line (``ok``) or error line."""

    def __init__(self, deployment: str, served: str) -> None:
        self.deployment, self.served = deployment, served

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        if row.get("skip"):
            return {"ok": False, "skip": True, "text": "", **NO_TOKENS}
        bad = row.get("bad")
        request: BatchRequest | None = row.get("request")
        if bad is None and request is not None and row.get(ERROR):
            # Parsed unchecked: a line the full checks refuse is a bad request, not the
            # deployment's failure (the same error line as before anything ran).
            checked = parse_line(row["text"], request.line)
            if isinstance(checked, BadLine):
                bad = error_line(checked.line, checked.custom_id, checked.code, checked.message)
            elif _IMAGE_ERROR.match(str(row[ERROR])):  # refused by the stage, never sent
                bad = error_line(
                    request.line, request.custom_id, "invalid_image_url", str(row[ERROR])
                )
            else:
                bad = error_line(
                    request.line,
                    request.custom_id,
                    "engine_error",
                    f"deployment {self.deployment!r}: {row[ERROR]}",
                )
        if bad is not None:
            return {"ok": False, "skip": False, "text": encode(bad), **NO_TOKENS}
        assert request is not None
        text = encode(response_line(request, row, self.served))
        return {
            "ok": True,
            "skip": False,
            "text": text,
            # The line's usage, summed by the driver per deployment (add_tokens).
            "prompt_tokens": row.get(NUM_INPUT_TOKENS) or 0,
            "completion_tokens": row.get(NUM_GENERATED_TOKENS) or 0,
        }


def write_block(batch: Any, output: IO[str], errors: IO[str]) -> tuple[int, int, int]:
    """A finished block's lines to their files: column work, no per-row Python but the join.
    Returns the lines written to each file and the lines skipped (stopped, not sent)."""
    import pyarrow.compute as pc

    ok, text = batch.column("ok"), batch.column("text")
    skipped = 0
    if "skip" in batch.column_names:
        skip = batch.column("skip")
        skipped = pc.sum(skip).as_py() or 0
        if skipped:
            keep = pc.invert(skip)
            ok, text = pc.filter(ok, keep), pc.filter(text, keep)
    good = pc.filter(text, ok).to_pylist()
    bad = pc.filter(text, pc.invert(ok)).to_pylist()
    if good:
        output.write("\n".join(good) + "\n")
    if bad:
        errors.write("\n".join(bad) + "\n")
    return len(good), len(bad), skipped


def add_tokens(totals: dict[str, int], batch: Any) -> None:
    """Add a written block's prompt and completion tokens (its output lines' usage) to
    ``totals``: a column sum each, no per-row Python."""
    import pyarrow.compute as pc

    for name in ("prompt_tokens", "completion_tokens"):
        if name in batch.column_names:
            totals[name] = totals.get(name, 0) + (pc.sum(batch.column(name)).as_py() or 0)


__all__ = ["NODE_ID_LABEL", "Parse", "ReadChunk", "Respond", "group_dataset", "groups_of"]
__all__ += ["add_tokens", "run_scanned", "write_block"]
