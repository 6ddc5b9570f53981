"""The relayllm engine that owns one ``sglang.Engine``. Runs only where sglang (and a GPU) is.

Everything that does not need the engine lives in :mod:`relayllm_sglang.translate` (rows
in), :mod:`relayllm_sglang.calls` (one engine call per batch) and
:mod:`relayllm_sglang.results` (results out); this module only wires those functions to the
engine's calls. The core's replica wraps it (adapter
contract 3): the pause gate, the runtime adapters' record and the weight version are its.
"""

from __future__ import annotations

import importlib.metadata
import logging
from types import ModuleType
from typing import Any

from relayllm.adapters import ControlRefusedError, Engine, MissingDependencyError, Request, Result
from relayllm.adapters.source import SourceLayoutError
from relayllm_sglang import INSTALL_HINT
from relayllm_sglang.calls import serve_batch
from relayllm_sglang.options import SGLangOptions, engine_kwargs
from relayllm_sglang.reasoning import prompt_opens_reasoning
from relayllm_sglang.results import id2label
from relayllm_sglang.source import installed, sampling_param_fields
from relayllm_sglang.translate import EngineInput, engine_input

logger = logging.getLogger(__name__)

#: Prompt tokens decoded to see whether the chat template opened the reasoning block: enough
#: for an opening tag and the newlines around it.
PROMPT_TAIL_TOKENS = 16

# -- control calls (relayllm.control) -> SGLang's own, the calls its HTTP server makes --------
#: relayllm's pause mode -> SGLang's (``PauseGenerationReqInput.mode``). ``wait``: the replica
#: has already let its rows in the engine finish, so the engine is idle and ``in_place`` (a
#: flag, nothing moved) is enough. ``keep``: ``retract`` moves the running requests back to
#: the engine's queue with the tokens made so far (their KV cache is recomputed at the resume):
#: they wait, nothing fails, and the cache can be flushed (reset_prefix_cache, sleep) during
#: the pause, which ``in_place`` refuses while requests run. SGLang's ``abort`` fails rows.
SGLANG_PAUSE_MODES = {"wait": "in_place", "keep": "retract"}
#: Sleep needs SGLang's memory saver; without it ``release_memory_occupation`` frees nothing.
MEMORY_SAVER = "enable_memory_saver"
#: Sleep level 1 keeps the weights in host memory (restored by wake_up): SGLang's CPU backup.
WEIGHTS_BACKUP = "enable_weights_cpu_backup"
SLEEP_LEVELS = (1, 2)
#: Runtime LoRA needs LoRA on in the engine: this server arg, or adapters at start (lora_paths).
ENABLE_LORA = "enable_lora"
ADAPTER_CALLS = ("load_adapter", "unload_adapter", "adapters")


def import_sglang() -> ModuleType:
    """``import sglang``, or an error that says which extra installs it."""
    try:
        import sglang
    except ImportError as exc:
        raise MissingDependencyError(
            f"the sglang backend needs the sglang engine on every node that runs a replica: "
            f"{INSTALL_HINT} (a CUDA GPU is required). Import failed with: {exc}"
        ) from exc
    return sglang


class SGLangEngine(Engine):
    backend_name = "sglang"

    options: SGLangOptions

    def start(self) -> None:
        self.paused = False  # between the deployment's pause and resume (the replica's gate)
        self.asleep: int | None = None  # the sleep level while the engine's memory is released
        sglang = import_sglang()
        self.engine = sglang.Engine(**engine_kwargs(self.options))
        # The engine's own tokenizer: it carries the chat template the engine loaded.
        self.tokenizer = self.engine.tokenizer_manager.tokenizer
        self.lora_names = frozenset(self.options.lora_paths or ())
        self.base_model_names = frozenset(
            n
            for n in (self.options.model_path, self.options.server_args.get("served_model_name"))
            if n
        )
        self.sampling_names = _sampling_param_names()
        self.engine_version = _version("sglang")
        # A classifier's class names (task classify), from the config the engine loaded.
        self.labels = (
            id2label(self.engine.tokenizer_manager.model_config.hf_config)
            if self.options.model_task == "classify"
            else {}
        )
        # The reasoning block's opening tag of the configured parser (e.g. "<think>"), to see
        # whether a chat template opened the block in the prompt (see _reasoning_parser).
        self.think_start = (
            self._new_reasoning_parser(force_reasoning=None).detector.think_start_token
            if self.options.reasoning_parser
            else ""
        )

    async def run_batch(self, requests: list[Request]) -> list[Result]:
        # The whole batch goes to the engine as one async_generate call (see serve_batch).
        return await serve_batch(
            requests,
            self._prepare,
            self.engine.async_generate,
            self.engine.async_encode,
            decode=lambda token_id: self.tokenizer.decode([token_id]),
            rerank=self._rerank,
            labels=self.labels,
            metrics=self.context.metrics,  # prefix-cache hits and latency, from meta_info
            reasoning_parser=self._reasoning_parser if self.options.reasoning_parser else None,
        )

    def _reasoning_parser(self, item: EngineInput) -> Any:
        """SGLang's reasoning parser for one chat answer, as its server builds one for a
        non-streamed chat completion; told that the answer starts inside the reasoning when the
        chat template opened the block at the end of the prompt (the answer then has no
        opening tag for the parser to find)."""
        tail = self.tokenizer.decode((item.input_ids or [])[-PROMPT_TAIL_TOKENS:])
        opened = prompt_opens_reasoning(tail, self.think_start)
        # None leaves each parser its own default (deepseek-r1 always starts in reasoning).
        return self._new_reasoning_parser(force_reasoning=True if opened else None)

    def _new_reasoning_parser(self, *, force_reasoning: bool | None) -> Any:
        from sglang.srt.parser.reasoning_parser import ReasoningParser

        return ReasoningParser(
            model_type=self.options.reasoning_parser,
            stream_reasoning=False,  # the whole answer at once: no partial tags to hold back
            force_reasoning=force_reasoning,
            tokenizer=self.tokenizer,
        )

    async def _rerank(self, **fields: Any) -> Any:
        """A cross-encoder request for (query, document) pairs: what ``Engine.rerank`` sends,
        awaited on this replica's event loop (``Engine.rerank`` blocks on its own)."""
        from sglang.srt.managers.io_struct import EmbeddingReqInput

        request = EmbeddingReqInput(**fields)
        return await self.engine.tokenizer_manager.generate_request(request, None).__anext__()

    def _prepare(self, request: Request) -> EngineInput:
        return engine_input(
            request,
            self.tokenizer,
            lora_names=self.lora_names,
            base_model_names=self.base_model_names,
            model_task=self.options.model_task,
            sampling_names=self.sampling_names,
        )

    # -- control calls: SGLang's TokenizerManager, awaited on this replica's loop ---------------
    # (``Engine``'s own wrappers run ``loop.run_until_complete`` and cannot be called from a
    # running loop; SGLang's HTTP server awaits these same TokenizerManager methods.)

    def refusal(self, call: str) -> str | None:
        if call in ("sleep", "wake_up") and not self.options.server_args.get(MEMORY_SAVER):
            return (
                f"sleep needs SGLang's memory saver: set server_args.{MEMORY_SAVER} "
                f"(without it release_memory_occupation frees nothing)"
            )
        if call in ADAPTER_CALLS:
            if not (self.options.server_args.get(ENABLE_LORA) or self.options.lora_paths):
                return (
                    f"LoRA is not enabled on this deployment's engine: set "
                    f"server_args.{ENABLE_LORA} (with max_lora_rank and lora_target_modules "
                    f"for adapters loaded at runtime only) or lora_paths"
                )
            if self.options.dp_size > 1:
                return "SGLang loads LoRA adapters at runtime only with dp_size 1"
        return None

    async def load_adapter(self, name: str, path: str) -> None:
        if name in self.lora_names:  # the same name again: replace it
            await self.unload_adapter(name)
        result = await self.engine.async_load_lora_adapter(name, path)
        if not result.success:  # SGLang answers a failed load, it does not raise
            raise RuntimeError(f"SGLang could not load the LoRA adapter: {result.error_message}")
        self.lora_names = self.lora_names | {name}

    async def unload_adapter(self, name: str) -> None:
        result = await self.engine.async_unload_lora_adapter(name)
        if not result.success:
            raise RuntimeError(f"SGLang could not unload the LoRA adapter: {result.error_message}")
        self.lora_names = self.lora_names - {name}

    async def update_weights(self, path: str, version: str) -> None:
        """Load the checkpoint in ``path`` in place: ``update_weights_from_disk``, what SGLang's
        server's /update_weights_from_disk awaits, which also records ``version`` as the
        engine's weight version and flushes the prefix cache (its default). The replica has
        drained the engine first, so no running request is aborted or paused by it."""
        from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqInput

        request = UpdateWeightFromDiskReqInput(model_path=path, weight_version=version)
        # SGLang answers (success, message, paused requests): a failed load is an answer.
        success, message, *_ = await self.engine.tokenizer_manager.update_weights_from_disk(
            request, None
        )
        if not success:
            raise RuntimeError(f"SGLang could not load the weights in {path}: {message}")

    async def pause(self, mode: str) -> None:
        from sglang.srt.managers.io_struct import PauseGenerationReqInput

        self.paused = True
        if self.asleep is None:  # a sleeping engine is paused already (retracted)
            request = PauseGenerationReqInput(mode=SGLANG_PAUSE_MODES[mode])
            await self.engine.tokenizer_manager.pause_generation(request)

    async def resume(self) -> None:
        self.paused = False
        if self.asleep is None:  # a sleeping engine goes on at wake_up
            await self._continue()

    async def is_paused(self) -> bool:
        return bool(self.engine.tokenizer_manager.is_pause)

    async def reset_prefix_cache(self) -> None:
        result = await self.engine.tokenizer_manager.flush_cache()
        if not result.success:
            raise RuntimeError(
                "the SGLang engine did not flush its cache (requests are running in it): "
                f"pause the deployment first ({result.message or 'no reason given'})"
            )

    async def sleep(self, level: int) -> None:
        """Release the GPU memory (KV cache, weights, CUDA graphs): SGLang's
        ``release_memory_occupation``. The engine is paused first with ``retract`` (SGLang
        releases memory only with nothing running): rows sent meanwhile wait in the engine
        until wake_up, none fails."""
        from sglang.srt.managers.io_struct import (
            PauseGenerationReqInput,
            ReleaseMemoryOccupationReqInput,
        )

        if level not in SLEEP_LEVELS:
            raise ValueError(f"sleep level {level!r}: use one of {SLEEP_LEVELS}")
        if level == 1 and not self.options.server_args.get(WEIGHTS_BACKUP):
            raise ControlRefusedError(
                self.backend_name,
                "sleep",
                f"level 1 keeps the weights in host memory, which SGLang does only with "
                f"server_args.{WEIGHTS_BACKUP}; set it, or sleep at level 2 (weights dropped)",
                self.context.name,
            )
        if self.asleep is not None:
            return
        pause = PauseGenerationReqInput(mode=SGLANG_PAUSE_MODES["keep"])  # retract
        await self.engine.tokenizer_manager.pause_generation(pause)
        release = ReleaseMemoryOccupationReqInput(tags=None)  # None: every kind of memory
        await self.engine.tokenizer_manager.release_memory_occupation(release, None)
        self.asleep = level

    async def wake_up(self) -> None:
        from sglang.srt.managers.io_struct import ResumeMemoryOccupationReqInput

        if self.asleep is None:
            return
        request = ResumeMemoryOccupationReqInput(tags=None)
        await self.engine.tokenizer_manager.resume_memory_occupation(request, None)
        self.asleep = None
        if not self.paused:  # a paused deployment's engine goes on at the resume
            await self._continue()

    async def _continue(self) -> None:
        from sglang.srt.managers.io_struct import ContinueGenerationReqInput

        await self.engine.tokenizer_manager.continue_generation(ContinueGenerationReqInput())

    async def tokenize(self, text: str) -> list[int]:
        """The ids of ``text`` itself (no special tokens added), so detokenize gives it back."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    async def detokenize(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))

    def info(self) -> dict[str, Any]:
        return {
            "model": self.options.model_path,
            "engine": "sglang",
            "engine_version": self.engine_version,
            "device": "cuda",
            "gpus": self.options.gpus,
            "tp_size": self.options.tp_size,
            "dp_size": self.options.dp_size,
            "lora_adapters": sorted(self.lora_names),
            "task": self.options.model_task,
            "seeded_sampling": self.options.seeded_sampling,
            "reasoning_parser": self.options.reasoning_parser,
            "asleep": self.asleep,
        }

    async def health(self) -> None:
        """The engine's scheduler and detokenizer processes are alive."""
        import psutil

        for pid in self.engine.get_all_child_pids():
            try:
                alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                alive = False
            if not alive:
                raise RuntimeError(f"sglang engine process {pid} has exited")

    def stop(self) -> None:
        """Shut the engine down: its GPU processes go with it (a retiring replica's call)."""
        engine = self.__dict__.pop("engine", None)
        if engine is not None:
            try:
                engine.shutdown()
            except Exception:
                logger.exception("sglang engine shutdown failed")

    def __del__(self) -> None:
        # Serve drops the replica when it stops: the engine's GPU processes go with it.
        self.stop()


def _sampling_param_names() -> set[str] | None:
    """SamplingParams' names in the installed sglang, so a row's unknown name is that row's
    error up front; None if unreadable (the engine then rejects it, still only for that row)."""
    tree = installed()
    try:
        return sampling_param_fields(tree) if tree else None
    except SourceLayoutError:
        return None


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


__all__ = ["SGLangEngine", "import_sglang"]
