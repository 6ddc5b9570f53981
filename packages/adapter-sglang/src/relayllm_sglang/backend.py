"""The ``sglang`` backend: options, deploy-time checks and the GPUs a replica reserves."""

from __future__ import annotations

import importlib.metadata
import logging
from typing import Any, ClassVar

from relayllm.adapters import FEATURES, Backend, ConfigError, Engine, row_tasks
from relayllm.adapters.source import SourceLayoutError, SourceTree
from relayllm_sglang import INSTALL_HINT, SGLANG_VERSION, source
from relayllm_sglang.options import SGLangOptions, check_server_arg_names, engine_kwargs
from relayllm_sglang.reasoning import reasoning_parser_problem

logger = logging.getLogger(__name__)


class SGLangBackend(Backend):
    name = "sglang"
    contract_version = 3
    Options = SGLangOptions
    requires: ClassVar[tuple[str, ...]] = ("sglang",)
    install_hint = INSTALL_HINT
    supported_versions: ClassVar[dict[str, str]] = {"sglang": SGLANG_VERSION}
    tasks = frozenset({"chat", "completion", "embedding", "classify", "score"})

    @classmethod
    def tasks_for(cls, options: SGLangOptions) -> frozenset[str]:
        """One engine runs one kind of model (``options.task``): a generation model serves
        text; a pooling model embeddings, class probabilities or cross-encoder scores."""
        return row_tasks(options.model_task)

    #: What the adapter translates to the engine's API (relayllm_sglang.translate). Refused up
    #: front: n > 1 (one output per prompt in a batched call) and tools (SGLang parses tool
    #: calls in its HTTP server, not in the Engine this adapter drives).
    features = frozenset(FEATURES) - {"n", "tools"}

    @classmethod
    def features_for(cls, options: SGLangOptions) -> frozenset[str]:
        return frozenset() if options.pooling else cls.features

    @classmethod
    def check_options(cls, options: SGLangOptions) -> None:
        """Every ServerArgs name the options produce exists in the installed sglang."""
        tree = source.installed()
        if tree is not None:
            check_options_against(options, tree)

    @classmethod
    def engine_class(cls) -> type[Engine]:
        from relayllm_sglang.deployment import SGLangEngine

        return SGLangEngine

    @classmethod
    def deployment_options(cls, options: SGLangOptions) -> dict[str, Any]:
        return placement(options)


def check_options_against(options: SGLangOptions, tree: SourceTree) -> None:
    """Check ``options`` against the sglang whose source is ``tree``: its ServerArgs, and its
    reasoning parsers (the options were checked against the pinned release's names; an
    installed release may have others)."""
    check_reasoning_parser(options, tree)
    try:
        known = source.server_args_fields(tree)
    except SourceLayoutError as exc:
        # A release laid out differently from the pinned one: the engine still rejects unknown
        # names itself when it starts, only later.
        logger.warning(
            "cannot read sglang's ServerArgs fields (%s); server_args are not checked", exc
        )
        return
    check_server_arg_names(set(engine_kwargs(options)), known)
    try:
        installed = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return
    if installed != SGLANG_VERSION:
        logger.warning(
            "sglang %s is installed; relayllm-sglang is tested with %s", installed, SGLANG_VERSION
        )


def check_reasoning_parser(options: SGLangOptions, tree: SourceTree) -> None:
    """``options.reasoning_parser`` is a parser of the sglang whose source is ``tree``."""
    if options.reasoning_parser is None:
        return
    try:
        known = source.reasoning_parser_names(tree)
    except SourceLayoutError as exc:
        # The engine still refuses an unknown parser itself when it starts, only later.
        logger.warning("cannot read sglang's reasoning parsers (%s); not checked", exc)
        return
    problem = reasoning_parser_problem(options.reasoning_parser, known)
    if problem is not None:
        raise ConfigError(f"invalid options for backend 'sglang': reasoning_parser {problem}")


def placement(options: SGLangOptions) -> dict[str, Any]:
    """Serve resources for one replica: ``options.gpus`` GPUs, in ONE bundle when more than one.

    SGLang starts its tensor-parallel workers as local subprocesses of the replica, which see
    the GPUs Ray assigns to the replica actor; so all of them must be that actor's, on one
    node (a single bundle, STRICT_PACK), not spread over bundles the workers cannot see.
    """
    gpus = options.gpus
    actor = {"num_cpus": 1, "num_gpus": gpus}
    if gpus == 1:
        return {"ray_actor_options": actor}
    return {
        "ray_actor_options": actor,
        "placement_group_bundles": [{"CPU": 1, "GPU": gpus}],
        "placement_group_strategy": "STRICT_PACK",
    }


__all__ = [
    "SGLangBackend",
    "check_options_against",
    "check_reasoning_parser",
    "placement",
]
