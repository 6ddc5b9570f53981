"""Running an OpenAI Batch API file of any size: read from disk in blocks, never whole in the
driver. :func:`run_batch_file` is the library's entry point (``relayllm batch`` calls it).

After the driver's scan (:mod:`relayllm.batch.scan`), :func:`run_scanned` runs each
(deployment, task) group as one Ray Data job: a read task per chunk reads its byte range from
disk and keeps its group's lines as rows of one canonical schema (``line`` int64, ``text`` the
line's JSON as a string), so every block concatenates with every other whatever the bodies
hold. The stage's ``preprocess`` parses the line inside the stage actor
(:func:`relayllm.batch.format.parse_line`), its ``postprocess`` renders the output line there;
the driver only writes the finished blocks' lines, in input order, and flushes each block.

A scoring line (``/v1/score``, ``/v1/rerank``) is one row per (query, document) pair: its read
task parses it and emits the pairs (all in one block), and the driver gathers them into the
line's response as they arrive.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from relayllm.batch.format import (
    BadLine,
    BatchRequest,
    default_deployment,
    error_line,
    gathered,
    model_not_found_line,
    parse_envelope,
    parse_line,
    request_counts,
    response_line,
    route_models,
    served_model,
)
from relayllm.batch.scan import Done, Scan, read_done, scan_batch_file, stage_batch
from relayllm.errors import ConfigError
from relayllm.rows import ERROR, INPUT_COLUMN, SAMPLING_PARAMS_COLUMN, Task

logger = logging.getLogger(__name__)

#: The label every Ray node carries with its id (what pins a task to one node).
NODE_ID_LABEL = "ray.io/node-id"

if TYPE_CHECKING:
    from ray.data import Dataset

    from relayllm.deployments import DeploymentConfig


@dataclass(frozen=True)
class BatchCounts:
    """OpenAI's ``request_counts`` for a whole file (a resumed run's earlier lines included),
    and where the lines went."""

    total: int
    completed: int
    failed: int
    output: str
    errors: str

    def request_counts(self) -> dict[str, int]:
        return request_counts(self.total, self.completed, self.failed)


@dataclass(frozen=True)
class BatchPlan:
    """What is about to run: the (deployment, task) groups in order, the lines of each."""

    groups: list[tuple[str, Task, int]]
    already_done: int  # lines a resumed run found in its files and does not run again

    @property
    def to_run(self) -> int:
        return sum(lines for _, _, lines in self.groups)


class BatchHooks:
    """What a batch run shows as it goes. The default shows nothing and connects with
    :func:`relayllm.cluster.connect`; the command line's display overrides these."""

    def connect(self, address: str | None) -> None:
        """Called once the file, the deployments file and the output are checked."""
        from relayllm.cluster import connect

        connect(address)

    def deploying(self, config: DeploymentConfig, running: bool) -> AbstractContextManager[Any]:
        """Held while ``config`` is deployed (``running``: reused, already up)."""
        return contextlib.nullcontext()

    def running(self, plan: BatchPlan) -> AbstractContextManager[Any]:
        """Held while the groups run, one after another."""
        return contextlib.nullcontext()


def run_batch_file(
    path: str | os.PathLike[str],
    *,
    deployment: str | None = None,
    pipeline: str | os.PathLike[str] | None = None,
    output: str | os.PathLike[str],
    errors: str | os.PathLike[str] | None = None,
    resume: bool = False,
    retry_errors: bool = False,
    batch_size: int = 64,
    concurrency: int = 1,
    address: str | None = None,
    hooks: BatchHooks | None = None,
) -> BatchCounts:
    """Run an OpenAI Batch API file; every line ends up in ``output`` or ``errors`` (default:
    ``OUTPUT.errors.jsonl``), each failure with its reason.

    Exactly one of ``deployment`` (a running deployment's name) or ``pipeline`` (a YAML file
    whose ``deployments:`` are started, or reused, for the run and the ones this call started
    shut down after; a pipeline file or one that declares only deployments). A body's
    ``model`` naming one of them routes its line there. ``resume`` keeps the lines already in
    both files and runs only the others (by ``custom_id``); ``retry_errors`` with it runs the
    errors file's lines again. Everything that can be wrong with the files is found before the
    cluster is touched.
    """
    if (deployment is None) == (pipeline is None):
        raise ConfigError("give exactly one of deployment= (a running one) or pipeline= (a file)")
    if retry_errors and not resume:
        raise ConfigError("retry_errors goes with resume: it runs the errors file's lines again")
    hooks = hooks or BatchHooks()
    output, errors = str(output), str(errors or default_errors_path(str(output)))
    # Read (and a line cut short by a kill trimmed) before the input scan: it skips those.
    done = read_done(output, errors, retry_errors) if resume else Done()
    scan = scan_batch_file(str(path), stage_batch(batch_size), done)
    fields = {"batch_size": batch_size, "concurrency": concurrency}
    declared = None
    if pipeline is not None:
        from relayllm.deployments.file import load_deployments

        declared = load_deployments(pipeline)
        declared.check_backends()
        names = declared.names
        default = default_deployment(names)
        groups_of(scan, names, default)  # routing errors before the cluster
    hooks.connect(address)
    with _deployments(declared, deployment, fields, address, hooks) as (names, default):
        groups = groups_of(scan, names, default)
        plan = BatchPlan(
            [(d, t, sum(scan.key_lines[k] for k in keys)) for (d, t), keys in groups.items()],
            scan.already,
        )
        mode = "a" if resume else "w"
        try:
            with (
                open(output, mode, encoding="utf-8") as out,
                open(errors, mode, encoding="utf-8") as err,
                hooks.running(plan),
            ):
                counts = run_scanned(scan, names, default, out, err, fields, done)
        except (TimeoutError, ConnectionError):
            raise  # OSErrors too, but from the cluster, not the files
        except OSError as exc:  # opening or writing the files (a full disk)
            where = exc.filename or f"{output} or {errors}"
            raise ConfigError(f"cannot write {where}: {exc.strerror or exc}") from None
    return BatchCounts(counts["total"], counts["completed"], counts["failed"], output, errors)


@contextlib.contextmanager
def _deployments(
    declared: Any, deployment: str | None, fields: dict[str, Any], address: str | None, hooks: Any
) -> Iterator[tuple[list[str], str | None]]:
    """The deployments to route to and the default one, up for the run."""
    from relayllm import deployments

    if declared is None:
        running = [r.name for r in deployments.list_deployments(address=address)]
        if deployment not in running:
            from relayllm.errors import DeploymentNotFoundError

            raise DeploymentNotFoundError(deployments.not_found_message(str(deployment), running))
        yield running, deployment
        return
    from relayllm.deployments.session import deployed_configs

    def fits(running: set[str]) -> None:
        _check_fit(declared.deployments, running, fields)

    warm_ups: list[StageWarmUp] = []

    def fits_then_warm(running: set[str]) -> None:
        fits(running)
        if any(d.name not in running for d in declared.deployments):  # an engine will start
            warm_ups.append(StageWarmUp.start(fields))  # after the check: it reserves CPU

    names = declared.names
    with deployed_configs(
        declared.deployments, fits=fits_then_warm, address=address, on_deploy=hooks.deploying
    ):
        for warm_up in warm_ups:
            warm_up.join()
        yield names, default_deployment(names)


class StageWarmUp:
    """While an engine starts (tens of seconds, one core busy importing it): a tiny Ray Data
    job whose tasks import what the batch's read and stage tasks import, on a thread of the
    driver. The batch's own tasks then run in worker processes that have those modules
    already, Ray Data's helper actors are up, and the driver has imported Ray Data: the rows
    start moving seconds sooner once the engine is ready (docs/benchmarks.md, section 10b).
    Best effort: a failure is logged and the batch runs as it would have."""

    def __init__(self, workers: int) -> None:
        import threading

        self.thread = threading.Thread(
            target=self._run, args=(workers,), name="relayllm-stage-warm-up", daemon=True
        )

    @classmethod
    def start(cls, fields: dict[str, Any]) -> StageWarmUp:
        from relayllm.config import ProcessorConfig
        from relayllm.processor import stage_workers

        workers, _, _ = stage_workers(ProcessorConfig(deployment="warm-up", **fields))
        warm_up = cls(workers + 1)  # the stage's tasks and the read task
        warm_up.thread.start()
        return warm_up

    def _run(self, workers: int) -> None:
        try:
            import ray.data

            from relayllm.fit import TASK_NUM_CPUS

            dataset = ray.data.range(workers, override_num_blocks=workers).map_batches(
                _import_stage_modules,
                batch_size=None,
                num_cpus=TASK_NUM_CPUS,
                compute=ray.data.TaskPoolStrategy(size=workers),
            )
            dataset.context.enable_progress_bars = False
            for _ in dataset.iter_batches(batch_size=None):
                pass
        except Exception:  # the batch runs without it
            logger.debug("the stage warm-up failed", exc_info=True)

    def join(self, timeout_s: float = 30.0) -> None:
        """Wait for it (normally done long before the engine), at most ``timeout_s``: the
        batch's own job starts after it, not beside it."""
        self.thread.join(timeout_s)


def _import_stage_modules(batch: Any) -> Any:
    """A warm-up task: the modules a batch's read and stage tasks import."""
    import pyarrow  # noqa: F401

    import relayllm.stage.udf  # noqa: F401  (this module's own imports came with the call)

    return batch


def _check_fit(configs: list[DeploymentConfig], running: set[str], fields: dict[str, Any]) -> None:
    """The engines not running yet, the stage and the read task fit on the cluster at once
    (groups run one after another: one stage at a time)."""
    from relayllm import fit
    from relayllm.config import ProcessorConfig
    from relayllm.deployments import engine_demand
    from relayllm.processor import stage_workers

    config = ProcessorConfig(deployment=configs[0].name, **fields)
    workers, _, cpus = stage_workers(config)
    demands = [engine_demand(d) for d in configs if d.name not in running]
    demands.append(fit.stage_demand("batch", cpus, workers, config.compute))
    demands.append(fit.task_demand(1))
    free, total, nodes = fit.cluster_view()
    fit.check_fit(demands, free, total, nodes)


def default_errors_path(output: str) -> str:
    """``OUT.jsonl`` -> ``OUT.errors.jsonl``, next to it."""
    path = Path(output)
    return str(path.with_name(path.name.removesuffix(".jsonl") + ".errors.jsonl"))


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
    default such a file is refused before anything runs, :func:`route_models`)."""
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
        write = _ScoreWriter(deployment, served_model(deployment)) if task == "score" else None
        for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
            if write is not None:
                ok, bad, skipped = write(batch.to_pylist(), output, errors)  # type: ignore[union-attr]
            else:
                ok, bad, skipped = _write_block(batch, output, errors)
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


#: Ray's key-value store namespace (in the GCS: seen from every node) of the stop signals.
STOP_NAMESPACE = "relayllm-stop"
#: How often a stage worker asks the cluster for a stop signal (a GCS call): at most once
#: this often per key and process, where the local flag file is a stat per line.
CLUSTER_CHECK_S = 0.5
_cluster_checks: dict[str, tuple[float, bool]] = {}  # key -> (when asked, the answer)


@dataclass(frozen=True)
class StopCheck:
    """When a run's lines stop being sent: once the file ``flag`` exists, the signal ``key``
    is raised (:func:`raise_stop`) or the clock passes ``deadline`` (the batch service's
    cancel and completion window). Asked by the stage workers for each line of a block (each
    pair of a scoring line) before its calls go out, so a stop takes effect within the calls
    in flight, not at the end of a block. The flag is a local file, seen at once on the node
    that writes it (the runner's, the head node); the key is in the cluster's key-value
    store, seen by stage workers on every node within :data:`CLUSTER_CHECK_S`."""

    flag: str | None = None
    deadline: float | None = None
    key: str | None = None

    def __call__(self) -> bool:
        if self.deadline is not None and time.time() >= self.deadline:
            return True
        if self.flag is not None and os.path.exists(self.flag):
            return True
        return self.key is not None and _stop_raised(self.key)


def _stop_raised(key: str) -> bool:
    now = time.monotonic()
    asked = _cluster_checks.get(key)
    if asked is not None and (asked[1] or now - asked[0] < CLUSTER_CHECK_S):
        return asked[1]
    from ray.experimental import internal_kv

    raised = internal_kv._internal_kv_initialized() and bool(
        internal_kv._internal_kv_exists(key, namespace=STOP_NAMESPACE)
    )
    _cluster_checks[key] = (now, raised)
    return raised


def raise_stop(key: str) -> None:
    """Raise the stop signal ``key`` for every :class:`StopCheck` that carries it, on any
    node of the cluster (needs a connection to Ray)."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, b"1", namespace=STOP_NAMESPACE)


def clear_stop(key: str) -> None:
    """Forget the signal ``key`` (its run has ended)."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(key, namespace=STOP_NAMESPACE)


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
                errors.write(_encode(line) + "\n")
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
    reader = _ReadChunk(scan.path, wanted, task)
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
        return build_processor(config, _StopPairs(stop) if stop is not None else None)(lines)
    served = served_model(deployment)
    return build_processor(config, _Parse(task, stop), _Respond(deployment, served))(lines)


class _ReadChunk:
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
                    for row in _pairs(line, text)
                ],
                schema=_score_schema(),
            )
        return pa.table({"line": pa.array(lines, pa.int64()), "text": pa.array(texts, pa.string())})


def _pairs(line: int, text: str) -> list[dict[str, Any]]:
    """A scoring line's rows: one per (query, document) pair; a bad line is one row that
    carries its error line (no query, so the stage sends nothing for it)."""
    request = parse_line(text, line)
    if isinstance(request, BadLine):
        message = error_line(request.line, request.custom_id, request.code, request.message)
        return [{"line": line, "pair": 0, "pairs": 1, "bad": json.dumps(message)}]
    return [
        {
            "line": line,
            "custom_id": request.custom_id,
            "pair": i,
            "pairs": len(request.pairs),
            "query": q,
            "document": d,
            "rerank": request.rerank,
            "top_n": request.top_n,
        }
        for i, (q, d) in enumerate(request.pairs)
    ]


def _score_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("line", pa.int64()),
            ("custom_id", pa.string()),
            ("pair", pa.int64()),
            ("pairs", pa.int64()),
            ("query", pa.string()),
            ("document", pa.string()),
            ("rerank", pa.bool_()),
            ("top_n", pa.int64()),
            ("bad", pa.string()),
        ]
    )


class _StopPairs:
    """``preprocess`` of a scoring group's pair rows in the stage actor, when the run can be
    stopped: a pair row after the stop carries ``skip`` and no query (nothing is sent for it),
    and :class:`_ScoreWriter` leaves its whole line unwritten, so a resumed or expired run
    finds the line undone."""

    def __init__(self, stop: StopCheck) -> None:
        self.stop = stop

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        if self.stop():
            return {**row, "skip": True, "query": None}
        return {**row, "skip": False}


class _Parse:
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
_encode = json.JSONEncoder(ensure_ascii=False).encode


class _Respond:
    """``postprocess`` in the stage actor: the row's output line (``ok``) or error line."""

    def __init__(self, deployment: str, served: str) -> None:
        self.deployment, self.served = deployment, served

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        if row.get("skip"):
            return {"ok": False, "skip": True, "text": ""}
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
            return {"ok": False, "skip": False, "text": _encode(bad)}
        assert request is not None
        text = _encode(response_line(request, row, self.served))
        return {"ok": True, "skip": False, "text": text}


def _write_block(batch: Any, output: IO[str], errors: IO[str]) -> tuple[int, int, int]:
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


class _ScoreWriter:
    """Gathers a scoring line's pair rows (they arrive in one block, in order) into its
    response; a pair that failed sends the whole line to the errors file; a line with a pair
    stopped before it was sent (``skip``) is written to neither file and counted as skipped."""

    def __init__(self, deployment: str, served: str) -> None:
        self.deployment, self.served = deployment, served
        self.pending: dict[int, list[dict[str, Any]]] = {}

    def __call__(
        self, rows: list[dict[str, Any]], output: IO[str], errors: IO[str]
    ) -> tuple[int, int, int]:
        ok = bad = skipped = 0
        for row in rows:
            if row.get("bad"):
                errors.write(row["bad"] + "\n")
                bad += 1
                continue
            pairs = self.pending.setdefault(row["line"], [])
            pairs.append(row)
            if len(pairs) < row["pairs"]:
                continue
            pairs = sorted(self.pending.pop(row["line"]), key=lambda r: r["pair"])
            if any(r.get("skip") for r in pairs):
                skipped += 1
                continue
            first = pairs[0]
            request = BatchRequest(
                first["line"],
                first["custom_id"],
                "score",
                None,
                {},
                None,
                [(r["query"], r["document"]) for r in pairs],
                bool(first["rerank"]),
                first["top_n"] or 0,
            )
            result = gathered(pairs)
            if result.get(ERROR):
                line = error_line(
                    request.line,
                    request.custom_id,
                    "engine_error",
                    f"deployment {self.deployment!r}: {result[ERROR]}",
                )
                errors.write(json.dumps(line, ensure_ascii=False) + "\n")
                bad += 1
            else:
                line = response_line(request, result, self.served)
                output.write(json.dumps(line, ensure_ascii=False) + "\n")
                ok += 1
        return ok, bad, skipped


__all__ = [
    "BatchCounts",
    "BatchHooks",
    "BatchPlan",
    "StopCheck",
    "clear_stop",
    "default_errors_path",
    "groups_of",
    "raise_stop",
    "run_batch_file",
    "run_scanned",
]
