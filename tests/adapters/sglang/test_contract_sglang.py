"""The API contract with the pinned sglang release, checked on its source (no GPU, no import).

Every name the adapter hands to sglang is derived here from the adapter's own code and
constants, then looked up in the released wheel: a rename upstream fails this test in CI
instead of a user's GPU job.
"""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import re
import zipfile

import pytest
from support import altered_wheel

import relayllm_sglang.deployment as deployment_module
from relayllm.testing.source import function_signature
from relayllm_sglang.calls import CROSS_ENCODER_FLAG, encode_kwargs, generate_kwargs, rerank_kwargs
from relayllm_sglang.options import FIRST_CLASS_OPTIONS, SGLangOptions, engine_kwargs
from relayllm_sglang.reasoning import REASONING_PARSERS, split_reasoning
from relayllm_sglang.results import (
    ABORT,
    CACHED_TOKENS,
    COMPLETION_TOKENS,
    E2E_LATENCY,
    FINISH_REASON,
    FINISH_REASONS,
    INPUT_LOGPROBS,
    INPUT_TOP_LOGPROBS,
    OUTPUT_LOGPROBS,
    OUTPUT_TOP_LOGPROBS,
    PROMPT_TOKENS,
)
from relayllm_sglang.source import (
    ENGINE_MODULE,
    REASONING_PARSER_MODULE,
    reasoning_parser_names,
    reasoning_parsers,
    sampling_param_fields,
    server_args_fields,
)
from relayllm_sglang.translate import (
    GRAMMAR_PARAMS,
    JSON_SCHEMA_PARAM,
    LOGPROB_ARGS,
    RENAMED_SAMPLING_PARAMS,
    SHARED_SAMPLING_PARAMS,
    STRUCTURED_PARAMS,
    EngineInput,
    sglang_sampling_params,
)

TOKENIZER_MANAGER = ("sglang.srt.managers.tokenizer_manager", "TokenizerManager")
MODEL_CONFIG = ("sglang.srt.configs.model_config", "ModelConfig")
EMBEDDING_REQUEST = ("sglang.srt.managers.io_struct", "EmbeddingReqInput")
SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
CLASSIFY_SERVING = "sglang.srt.entrypoints.openai.serving_classify"
REASONING_PARSER = (REASONING_PARSER_MODULE, "ReasoningParser")
#: The dependency-free copy of the parser names that the server's --reasoning-parser offers.
REASONING_PARSER_NAMES = "sglang.srt.parser.reasoning_parser_names"
#: Types of the engine attributes the deployment reaches through (engine.<path>.<member>);
#: a path not listed here leaves sglang (hf_config is transformers').
ENGINE_ATTRIBUTE_TYPES = {
    ("tokenizer_manager",): TOKENIZER_MANAGER,
    ("tokenizer_manager", "model_config"): MODEL_CONFIG,
}


def method_parameters(sglang_source, module: str, cls: str, method: str) -> tuple[set[str], bool]:
    """Keyword-passable parameter names of ``cls.method`` and whether it takes ``**kwargs``."""
    signature = function_signature(sglang_source.method(module, cls, method), method=True)
    return set(signature.keywords), signature.varkw


def every_option_set() -> SGLangOptions:
    """Options with every first-class field set, so every Engine kwarg they map to appears."""
    return SGLangOptions(
        model_path="m",
        tokenizer_path="t",
        tp_size=2,
        dp_size=2,
        mem_fraction_static=0.5,
        context_length=1024,
        chunked_prefill_size=512,
        max_running_requests=8,
        dtype="bfloat16",
        chat_template="c.jinja",
        lora_paths={"a": "p"},
        reasoning_parser="qwen3",
    )


def test_the_wheel_is_the_pinned_release(sglang_wheel, sglang_version):
    with zipfile.ZipFile(sglang_wheel) as wheel:
        metadata = wheel.read(f"sglang-{sglang_version}.dist-info/METADATA").decode()
    assert re.search(rf"^Version: {re.escape(sglang_version)}$", metadata, re.M)


def test_engine_kwargs_are_serverargs_fields(sglang_source):
    kwargs = engine_kwargs(every_option_set())
    assert set(kwargs) == FIRST_CLASS_OPTIONS, "a new option must be set in every_option_set()"
    # A pooling task adds is_embedding.
    for task in ("embed", "classify", "score"):
        kwargs.update(engine_kwargs(SGLangOptions(model_path="m", task=task)))
    assert "is_embedding" in kwargs
    params, takes_kwargs = method_parameters(sglang_source, ENGINE_MODULE, "Engine", "__init__")
    # Engine(**kwargs) builds ServerArgs(**kwargs): each name must be a ServerArgs field.
    assert takes_kwargs or set(kwargs) <= params
    missing = set(kwargs) - server_args_fields(sglang_source)
    assert not missing, (
        f"sglang {sglang_source.root.name} has no ServerArgs field(s) {sorted(missing)}"
    )


def test_server_args_the_adapter_reads_are_serverargs_fields(sglang_source):
    # Names the options read from server_args (embedding model, seeds, DP attention) ...
    source = inspect.getsource(SGLangOptions) + inspect.getsource(deployment_module)
    read = set(re.findall(r"server_args\.get\(\"(\w+)\"\)", source))
    assert {"is_embedding", "enable_deterministic_inference", "enable_dp_attention"} <= read
    missing = read - server_args_fields(sglang_source)
    assert not missing, f"ServerArgs has no {sorted(missing)}"


def test_async_generate_keywords_exist(sglang_source):
    rows = [EngineInput("generate", input_ids=[1], sampling_params={}, lora="a", priority=10)]
    used = set(generate_kwargs(rows))
    params, _ = method_parameters(sglang_source, ENGINE_MODULE, "Engine", "async_generate")
    assert {"input_ids", "sampling_params", "lora_path", "priority"} <= used
    assert used <= params, f"Engine.async_generate has no {sorted(used - params)}"


def test_async_encode_keywords_exist(sglang_source):
    used = set(encode_kwargs([EngineInput("encode", text="x", lora="a")]))
    params, _ = method_parameters(sglang_source, ENGINE_MODULE, "Engine", "async_encode")
    assert {"prompt", "lora_path"} <= used
    assert used <= params, f"Engine.async_encode has no {sorted(used - params)}"


def test_sampling_param_names_the_adapter_emits_exist(sglang_source):
    values = {
        "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}
    }
    every = {
        **{name: 1 for name in RENAMED_SAMPLING_PARAMS if name not in ("max_completion_tokens",)},
        **{name: 1 for name in SHARED_SAMPLING_PARAMS},
        **values,
    }
    emitted = set(sglang_sampling_params(every))
    assert set(RENAMED_SAMPLING_PARAMS.values()) | {JSON_SCHEMA_PARAM} <= emitted
    missing = emitted - sampling_param_fields(sglang_source)
    assert not missing, f"SamplingParams has no {sorted(missing)}"


def test_surface_names_the_adapter_emits_exist(sglang_source):
    """Logprobs travel as async_generate arguments and come back in meta_info; structured
    output forms become SamplingParams fields; the features the adapter declares rest on
    these names (n and tools are refused up front, SGLangBackend.features)."""
    item = EngineInput("generate", input_ids=[1], sampling_params={}, top_logprobs=2)
    used = set(generate_kwargs([item, EngineInput("generate", input_ids=[2], prompt_logprobs=1)]))
    params, _ = method_parameters(sglang_source, ENGINE_MODULE, "Engine", "async_generate")
    assert set(LOGPROB_ARGS) <= used <= params, sorted(used - params)
    forms = {"json": {"type": "object"}, "regex": "a+", "choice": ["a"], "grammar": 'root ::= "a"'}
    assert set(forms) == set(STRUCTURED_PARAMS)
    for form, value in forms.items():
        emitted = set(sglang_sampling_params({"structured_outputs": {form: value}}))
        assert emitted == {STRUCTURED_PARAMS[form]}
        assert emitted <= sampling_param_fields(sglang_source), emitted
    module = sglang_source.module(TOKENIZER_MANAGER[0])
    subscripts = {
        node.slice.value
        for node in ast.walk(module)
        if isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    }
    wanted = {OUTPUT_LOGPROBS, OUTPUT_TOP_LOGPROBS, INPUT_LOGPROBS, INPUT_TOP_LOGPROBS}
    assert wanted <= subscripts, f"meta_info no longer has {sorted(wanted - subscripts)}"


def engine_attribute_chains() -> set[tuple[str, ...]]:
    """``self.engine.a.b`` (or ``engine.a.b``) accesses in the deployment module, as ("a", "b")."""
    tree = ast.parse(inspect.getsource(deployment_module))
    chains = set()
    for node in ast.walk(tree):
        names = []
        while isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        names.reverse()
        if isinstance(node, ast.Name) and node.id == "self" and names[:1] == ["engine"]:
            names = names[1:]
        elif not (isinstance(node, ast.Name) and node.id == "engine"):
            continue
        if names:
            chains.add(tuple(names))
    return chains


def test_engine_members_the_deployment_uses_exist(sglang_source):
    chains = engine_attribute_chains()
    used = {chain[0] for chain in chains}
    assert {
        "async_generate",
        "async_encode",
        "tokenizer_manager",
        "shutdown",
        "get_all_child_pids",
    } <= used
    missing = used - sglang_source.members(ENGINE_MODULE, "Engine")
    assert not missing, f"sglang.Engine has no {sorted(missing)}"
    # The classifier's labels and the cross-encoder request go through the tokenizer manager.
    assert {
        ("tokenizer_manager", "model_config", "hf_config"),
        ("tokenizer_manager", "generate_request"),
    } <= chains
    for chain in (c for c in chains if len(c) >= 2):
        assert (chain[0],) in ENGINE_ATTRIBUTE_TYPES, (
            f"the deployment uses engine.{'.'.join(chain)}: add the type of {chain[0]!r} here"
        )
        for depth in range(1, len(chain)):
            owner = ENGINE_ATTRIBUTE_TYPES.get(chain[:depth])
            if owner is None:
                break
            assert chain[depth] in sglang_source.members(*owner), (
                f"{owner[1]} has no {chain[depth]!r} (engine.{'.'.join(chain)})"
            )


def test_sglang_imports_of_the_deployment_exist(sglang_source):
    """``from sglang... import X`` in the replica (the cross-encoder request type) resolves in
    the pinned release."""
    imported = {
        (node.module, alias.name)
        for node in ast.walk(ast.parse(inspect.getsource(deployment_module)))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang")
        for alias in node.names
    }
    assert EMBEDDING_REQUEST in imported
    for module, name in imported:
        sglang_source.definition(module, name)  # raises SourceLayoutError if it is gone


def test_pooling_requests_use_the_engines_own_names(sglang_source):
    """classify rows are async_encode calls; score rows are the EmbeddingReqInput that
    Engine.rerank builds (text pairs, the cross-encoder flag), awaited the way async_encode
    awaits its own."""
    encode = set(encode_kwargs([EngineInput("classify", text="x", lora="a")]))
    params, _ = method_parameters(sglang_source, ENGINE_MODULE, "Engine", "async_encode")
    assert encode <= params, sorted(encode - params)
    pairs = rerank_kwargs([EngineInput("score", pair=("q", "d"), lora="a")])
    assert {"text", CROSS_ENCODER_FLAG, "lora_path"} == set(pairs)
    fields = sglang_source.fields(*EMBEDDING_REQUEST)
    assert set(pairs) <= fields, f"EmbeddingReqInput has no {sorted(set(pairs) - fields)}"
    rerank = engine_method(sglang_source, "rerank")
    built = [
        {k.arg for k in node.keywords}
        for node in ast.walk(rerank)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == EMBEDDING_REQUEST[1]
    ]
    assert built == [{"text", CROSS_ENCODER_FLAG}], built
    # Both reach the scheduler through TokenizerManager.generate_request(obj, request).
    calls = {
        ast.unparse(node.func)
        for name in ("rerank", "async_encode")
        for node in ast.walk(engine_method(sglang_source, name))
        if isinstance(node, ast.Call)
    }
    assert "self.tokenizer_manager.generate_request" in calls, calls


def test_pooling_outputs_are_read_as_sglang_builds_and_reads_them(sglang_source):
    """An embedding request's output carries ``embedding`` and ``meta_info.prompt_tokens``;
    SGLang's own /v1/classify makes probabilities with a softmax over that ``embedding`` and
    the label from ``id2label``, as classify_result does."""
    keys = sglang_source.string_dict_keys(TOKENIZER_MANAGER[0])
    assert {"embedding", PROMPT_TOKENS} <= keys
    classify = sglang_source.module(CLASSIFY_SERVING)
    names = {n.attr for n in ast.walk(classify) if isinstance(n, ast.Attribute)}
    assert {"softmax", "argmax", "id2label"} <= names, names
    assert "embedding" in {n.value for n in ast.walk(classify) if isinstance(n, ast.Constant)}


def engine_method(sglang_source, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The definition of ``Engine.<name>`` in the pinned release (its own or a mixin's)."""
    for _, klass in sglang_source.mro(ENGINE_MODULE, "Engine"):
        for item in klass.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                return item
    raise AssertionError(f"sglang.Engine has no {name}")


def class_method(sglang_source, module: str, cls: str, name: str) -> ast.FunctionDef:
    """The definition of ``cls.<name>`` in the pinned release (its own or a base's)."""
    for _, klass in sglang_source.mro(module, cls):
        for item in klass.body:
            if isinstance(item, ast.FunctionDef) and item.name == name:
                return item
    raise AssertionError(f"{cls} has no {name}")


def test_the_reasoning_parser_option_takes_the_releases_parser_names(sglang_source):
    """The option accepts exactly the names of the pinned release's ReasoningParser registry
    (DetectorMap), which are also the names its server's --reasoning-parser offers."""
    registry = reasoning_parser_names(sglang_source)
    assert registry == REASONING_PARSERS, (
        f"update relayllm_sglang.reasoning.REASONING_PARSERS: the release adds "
        f"{sorted(registry - REASONING_PARSERS)} and drops {sorted(REASONING_PARSERS - registry)}"
    )
    (listed,) = (
        node.value
        for node in sglang_source.module(REASONING_PARSER_NAMES).body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "REASONING_PARSER_NAMES"
    )
    assert set(ast.literal_eval(listed)) == registry


def test_the_reasoning_parser_is_built_and_called_as_the_release_defines_it(sglang_source):
    """The replica builds ``ReasoningParser(...)`` from the module it lives in, with keywords
    its constructor has; split_reasoning calls the method that returns (reasoning, answer) in
    that order; the replica reads the opening tag of every registered detector."""
    tree = ast.parse(inspect.getsource(deployment_module))
    imported = {
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert REASONING_PARSER in imported
    built = [
        {k.arg for k in node.keywords}
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == REASONING_PARSER[1]
    ]
    assert len(built) == 1 and "model_type" in built[0], built
    params, _ = method_parameters(sglang_source, *REASONING_PARSER, "__init__")
    assert built[0] <= params, f"ReasoningParser() has no {sorted(built[0] - params)}"
    # force_reasoning=None must leave each detector its own default: the constructor passes
    # it on only when set.
    init = class_method(sglang_source, *REASONING_PARSER, "__init__")
    with_defaults = [a.arg for a in init.args.args][len(init.args.args) - len(init.args.defaults) :]
    defaults = dict(zip(with_defaults, init.args.defaults, strict=True))
    assert ast.unparse(defaults["force_reasoning"]) == "None"
    assert "if force_reasoning is not None" in ast.unparse(init)

    called = {
        node.func.attr
        for node in ast.walk(ast.parse(inspect.getsource(split_reasoning)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and ast.unparse(node.func.value) == "parser"
    }
    assert len(called) == 1, called
    (method,) = called
    parse = class_method(sglang_source, *REASONING_PARSER, method)  # fails if it is gone
    assert [a.arg for a in parse.args.args] == ["self", "full_text"]
    returns = [node.value for node in ast.walk(parse) if isinstance(node, ast.Return)]
    assert returns and all(isinstance(r, ast.Tuple) and len(r.elts) == 2 for r in returns)
    for reasoning, answer in (r.elts for r in returns if isinstance(r, ast.Tuple)):
        assert "reasoning" in ast.unparse(reasoning) and "normal" in ast.unparse(answer)

    assert ".detector.think_start_token" in inspect.getsource(deployment_module)
    assert "detector" in sglang_source.members(*REASONING_PARSER)
    for name, detector in reasoning_parsers(sglang_source).items():
        assert "think_start_token" in sglang_source.members(REASONING_PARSER_MODULE, detector), (
            f"the {name!r} parser's {detector} has no think_start_token"
        )


def test_the_grammar_fields_that_keep_an_answer_whole_are_sampling_params(sglang_source):
    """A chat row with one of these is not split into reasoning (see EngineInput.may_reason):
    each must be a SamplingParams field, and every form of structured output one of them."""
    missing = GRAMMAR_PARAMS - sampling_param_fields(sglang_source)
    assert not missing, f"SamplingParams has no {sorted(missing)}"
    assert {JSON_SCHEMA_PARAM, *STRUCTURED_PARAMS.values()} <= GRAMMAR_PARAMS


def test_engine_is_exported_by_the_top_level_package(sglang_source):
    assert "sglang.Engine(" in inspect.getsource(deployment_module)
    where, node = sglang_source.find_class(ENGINE_MODULE, "Engine")
    assert node.name == "Engine" and where.startswith("sglang.")


def test_meta_info_names_the_adapter_reads(sglang_source):
    keys = sglang_source.string_dict_keys(TOKENIZER_MANAGER[0])
    read = {PROMPT_TOKENS, COMPLETION_TOKENS, FINISH_REASON, CACHED_TOKENS, E2E_LATENCY}
    missing = read - keys
    assert not missing, f"the TokenizerManager no longer builds meta_info keys {sorted(missing)}"
    kinds = sglang_source.dict_values_for_key(SCHEDULE_BATCH, "type")
    assert set(FINISH_REASONS) | {ABORT} <= kinds, kinds


def test_the_tokenizer_libraries_here_are_the_engines(sglang_wheel, sglang_version):
    """The chat-template tests run with the transformers/tokenizers versions sglang pins."""
    with zipfile.ZipFile(sglang_wheel) as wheel:
        metadata = wheel.read(f"sglang-{sglang_version}.dist-info/METADATA").decode()
    for name in ("transformers", "tokenizers"):
        pin = re.search(rf"^Requires-Dist: {name}==([\w.]+)\s*$", metadata, re.M)
        if pin is None:
            pytest.fail(f"sglang {sglang_version} no longer pins {name}; update the test env")
        assert importlib.metadata.version(name) == pin.group(1), (
            f"tox -e sglang installs {name} {importlib.metadata.version(name)}; "
            f"sglang pins {pin.group(1)}"
        )


# -- control calls (relayllm.control) ----------------------------------------------------------

IO_STRUCT = "sglang.srt.managers.io_struct"
SCHEDULER = ("sglang.srt.managers.scheduler", "Scheduler")
#: Where SGLang's scheduler releases memory (asserting that nothing runs).
SCHEDULER_WEIGHTS = "sglang.srt.managers.scheduler_components.weight_updater"
#: Each control method of the engine -> the TokenizerManager methods it awaits.
CONTROL_METHODS = {
    "pause": {"pause_generation"},
    "resume": set(),  # through _continue
    "_continue": {"continue_generation"},
    "reset_prefix_cache": {"flush_cache"},
    "sleep": {"pause_generation", "release_memory_occupation"},
    "wake_up": {"resume_memory_occupation"},
    "update_weights": {"update_weights_from_disk"},
}


def deployment_functions() -> dict[str, ast.AsyncFunctionDef | ast.FunctionDef]:
    tree = ast.parse(inspect.getsource(deployment_module))
    return {
        node.name: node
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def manager_calls(function: ast.AST) -> list[ast.Call]:
    """``self.engine.tokenizer_manager.<method>(...)`` calls in ``function``."""
    return [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and ast.unparse(node.func).startswith("self.engine.tokenizer_manager.")
    ]


def io_struct_builds(function: ast.AST) -> list[ast.Call]:
    """``XReqInput(...)`` calls in ``function`` of a class imported from io_struct."""
    imported = {
        alias.asname or alias.name
        for node in ast.walk(function)
        if isinstance(node, ast.ImportFrom) and node.module == IO_STRUCT
        for alias in node.names
    }
    return [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in imported
    ]


def test_control_hooks_call_the_tokenizer_managers_methods_as_defined(sglang_source):
    """Every control hook awaits the TokenizerManager methods SGLang's own HTTP server awaits
    (/pause_generation, /continue_generation, /flush_cache, /release_memory_occupation,
    /resume_memory_occupation), with arguments their signatures take, and builds each request
    object with fields it has."""
    functions = deployment_functions()
    for hook, expected in CONTROL_METHODS.items():
        calls = manager_calls(functions[hook])
        assert {c.func.attr for c in calls} == expected, hook  # type: ignore[attr-defined]
        for call in calls:
            method = call.func.attr  # type: ignore[attr-defined]
            definition = class_method_any(sglang_source, *TOKENIZER_MANAGER, method)
            refused = function_signature(definition, method=True).refuses(
                len(call.args), {k.arg for k in call.keywords if k.arg}
            )
            assert refused is None, f"TokenizerManager.{method}: {refused}"
            assert isinstance(definition, ast.AsyncFunctionDef), f"{method} is not awaitable"
        for build in io_struct_builds(functions[hook]):
            name = build.func.id  # type: ignore[attr-defined]
            used = {k.arg for k in build.keywords if k.arg}
            fields = sglang_source.fields(IO_STRUCT, name)
            assert not build.args and used <= fields, f"{name} has no {sorted(used - fields)}"
    http = sglang_source.module("sglang.srt.entrypoints.http_server")
    served = {
        ast.unparse(node.func).rpartition(".")[2]
        for node in ast.walk(http)
        if isinstance(node, ast.Call)
        and ast.unparse(node.func).startswith("_global_state.tokenizer_manager.")
    }
    assert set().union(*CONTROL_METHODS.values()) <= served, "SGLang's server calls them so"


def class_method_any(sglang_source, module: str, cls: str, name: str):
    """``cls.<name>`` (sync or async) in the pinned release, its own or a base's/mixin's."""
    for _, klass in sglang_source.mro(module, cls):
        for item in klass.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                return item
    raise AssertionError(f"{cls} has no {name}")


def literal_strings(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def test_pause_modes_are_ones_the_scheduler_takes_and_none_aborts(sglang_source):
    """relayllm's wait/keep map onto modes PauseGenerationReqInput declares and the scheduler
    accepts (it asserts in_place or retract); never ``abort``, which fails the rows."""
    _, request = sglang_source.find_class(IO_STRUCT, "PauseGenerationReqInput")
    (annotation,) = (
        item.annotation
        for item in request.body
        if isinstance(item, ast.AnnAssign) and ast.unparse(item.target) == "mode"
    )
    declared = literal_strings(annotation)
    pause = class_method_any(sglang_source, *SCHEDULER, "pause_generation")
    (accepted,) = (literal_strings(n.test) for n in ast.walk(pause) if isinstance(n, ast.Assert))
    modes = set(deployment_module.SGLANG_PAUSE_MODES.values())
    assert set(deployment_module.SGLANG_PAUSE_MODES) == {"wait", "keep"}
    assert modes <= declared & accepted and "abort" not in modes, (declared, accepted)
    # in_place leaves the running requests where they are; retract moves them back to the
    # queue (what lets the cache be flushed and the memory released while paused).
    text = ast.unparse(pause)
    assert "if recv_req.mode == 'in_place'" in text and "retract_all(" in text
    # The tokenizer side sends non-abort pauses on to the scheduler (abort fails requests).
    manager_pause = ast.unparse(
        class_method_any(sglang_source, *TOKENIZER_MANAGER, "pause_generation")
    )
    assert (
        "if obj.mode != 'abort'" in manager_pause
        and "_async_dispatch_to_scheduler" in manager_pause
    )


def test_rows_sent_to_a_paused_engine_wait_for_the_resume(sglang_source):
    """A request reaching a paused (or sleeping) engine waits on the pause condition in the
    TokenizerManager and goes on at continue_generation, which notifies it: it does not fail.
    ``is_pause`` is the flag both set, which is_paused reads."""
    assert "is_pause" in sglang_source.members(*TOKENIZER_MANAGER)
    manager = ast.unparse(sglang_source.module(TOKENIZER_MANAGER[0]))
    assert "await self.is_pause_cond.wait_for(lambda: not self.is_pause)" in manager
    resume = ast.unparse(class_method_any(sglang_source, *TOKENIZER_MANAGER, "continue_generation"))
    assert "self.is_pause = False" in resume and "notify_all()" in resume
    assert "self.engine.tokenizer_manager.is_pause" in inspect.getsource(deployment_module)


def test_flush_cache_answers_with_success_and_message(sglang_source):
    """reset_prefix_cache reads ``success`` and ``message`` of the FlushCacheReqOutput
    that TokenizerManager.flush_cache returns (False while requests run)."""
    flush = class_method_any(sglang_source, *TOKENIZER_MANAGER, "flush_cache")
    assert ast.unparse(flush.returns) == "FlushCacheReqOutput"
    assert {"success", "message"} <= sglang_source.fields(IO_STRUCT, "FlushCacheReqOutput")
    source = inspect.getsource(deployment_module.SGLangEngine.reset_prefix_cache)
    assert "result.success" in source and "result.message" in source


def test_sleep_needs_the_memory_saver_and_an_idle_engine(sglang_source):
    """The server args sleep depends on exist; releasing memory asserts that nothing runs
    unless the engine is paused (then queued requests may wait), which is why sleep
    pauses with retract first; without the memory saver the release is a no-op adapter."""
    fields = server_args_fields(sglang_source)
    assert {deployment_module.MEMORY_SAVER, deployment_module.WEIGHTS_BACKUP} <= fields
    release = ast.unparse(
        class_method_any(
            sglang_source,
            SCHEDULER_WEIGHTS,
            "SchedulerWeightUpdaterManager",
            "release_memory_occupation",
        )
    )
    assert "ignore_waiting=scheduler is not None and scheduler._engine_paused" in release
    assert "tags is None or len(tags) == 0" in release  # tags=None: every kind of memory
    adapter = ast.unparse(sglang_source.module("sglang.srt.utils.torch_memory_saver_adapter"))
    assert "_TorchMemorySaverAdapterReal() if enable else _TorchMemorySaverAdapterNoop()" in adapter
    assert deployment_module.SGLANG_PAUSE_MODES["keep"] == "retract"


def test_runtime_lora_calls_the_engines_async_adapter_methods_as_defined(sglang_source):
    """load_adapter/unload_adapter await Engine.async_load_lora_adapter(name, path) /
    async_unload_lora_adapter(name) and read ``success`` and ``error_message`` of the
    LoRAUpdateOutput they return (a failed load is an answer, not an exception); LoRA at
    runtime needs the ``enable_lora`` server arg."""
    functions = deployment_functions()
    expected = {
        "load_adapter": ("async_load_lora_adapter", 2),
        "unload_adapter": ("async_unload_lora_adapter", 1),
    }
    for hook, (method, positional) in expected.items():
        (call,) = [
            node
            for node in ast.walk(functions[hook])
            if isinstance(node, ast.Call) and ast.unparse(node.func) == f"self.engine.{method}"
        ]
        assert len(call.args) == positional and not call.keywords
        definition = engine_method(sglang_source, method)
        assert isinstance(definition, ast.AsyncFunctionDef), method
        assert function_signature(definition, method=True).refuses(positional, set()) is None
        returned = [n.value for n in ast.walk(definition) if isinstance(n, ast.Return)]
        (manager_call,) = [ast.unparse(r) for r in returned if r is not None]
        manager_method = manager_call.split("tokenizer_manager.")[1].split("(")[0]
        annotation = class_method_any(sglang_source, *TOKENIZER_MANAGER, manager_method).returns
        assert ast.unparse(annotation) in {"LoadLoRAAdapterReqOutput", "UnloadLoRAAdapterReqOutput"}
        assert "result.success" in ast.unparse(functions[hook])
        assert "result.error_message" in ast.unparse(functions[hook])
    aliases = ast.unparse(sglang_source.module(IO_STRUCT))
    assert (
        "LoadLoRAAdapterReqOutput = UnloadLoRAAdapterReqOutput = "
        "LoadLoRAAdapterFromTensorsReqOutput = LoRAUpdateOutput" in aliases
    )
    assert {"success", "error_message"} <= sglang_source.fields(IO_STRUCT, "LoRAUpdateOutput")
    assert deployment_module.ENABLE_LORA in server_args_fields(sglang_source)


def test_update_weights_from_disk_answers_success_message_and_paused_requests(sglang_source):
    """engine_update_weights unpacks (success, message, ...) from
    TokenizerManager.update_weights_from_disk (a failed load is an answer, not an exception),
    and the request fields it sets exist: model_path and weight_version, the version SGLang
    then reports as its own."""
    update = class_method_any(sglang_source, *TOKENIZER_MANAGER, "update_weights_from_disk")
    returned = [
        ast.unparse(n.value) for n in ast.walk(update) if isinstance(n, ast.Return) and n.value
    ]
    assert returned == ["(success, message, num_paused_requests)"], returned
    assert "self._update_weight_version_if_provided(obj.weight_version)" in ast.unparse(update)
    fields = sglang_source.fields(IO_STRUCT, "UpdateWeightFromDiskReqInput")
    assert {"model_path", "weight_version", "flush_cache"} <= fields
    source = inspect.getsource(deployment_module.SGLangEngine.update_weights)
    assert "success, message, *_ = await" in source and "if not success" in source


@pytest.mark.parametrize(
    ("test", "path", "old", "new"),
    [
        (  # a method renamed
            test_control_hooks_call_the_tokenizer_managers_methods_as_defined,
            "sglang/srt/managers/tokenizer_manager.py",
            "async def continue_generation(self, obj",
            "async def resume_generation(self, obj",
        ),
        (  # a request field renamed
            test_control_hooks_call_the_tokenizer_managers_methods_as_defined,
            "sglang/srt/managers/io_struct.py",
            "class ReleaseMemoryOccupationReqInput(BaseReq, kw_only=True):\n"
            "    # Optional tags to identify the memory region, which is primarily used for RL\n"
            "    # Currently we only support `weights` and `kv_cache`\n"
            "    tags:",
            "class ReleaseMemoryOccupationReqInput(BaseReq, kw_only=True):\n"
            "    # Optional tags to identify the memory region, which is primarily used for RL\n"
            "    # Currently we only support `weights` and `kv_cache`\n"
            "    memory_tags:",
        ),
        (  # a pause mode the scheduler no longer takes
            test_pause_modes_are_ones_the_scheduler_takes_and_none_aborts,
            "sglang/srt/managers/scheduler.py",
            'assert recv_req.mode in ("in_place", "retract")',
            'assert recv_req.mode in ("in_place",)',
        ),
        (  # the flag the server arg sleep depends on gone
            test_sleep_needs_the_memory_saver_and_an_idle_engine,
            "sglang/srt/arg_groups/fields/exec_.py",
            "    enable_memory_saver: A[",
            "    enable_gpu_memory_saver: A[",
        ),
        (  # the adapter name made keyword-only: the adapter's positional call breaks
            test_runtime_lora_calls_the_engines_async_adapter_methods_as_defined,
            "sglang/srt/entrypoints/engine.py",
            "    async def async_unload_lora_adapter(self, lora_name: str):",
            "    async def async_unload_lora_adapter(self, *, lora_name: str):",
        ),
    ],
    ids=["method-renamed", "field-renamed", "mode-dropped", "server-arg-renamed", "keyword-only"],
)
def test_a_changed_control_api_fails_the_control_checks(
    sglang_wheel, tmp_path, test, path, old, new
):
    """The control checks catch what they are for, on the same wheel with one thing changed."""
    from relayllm.testing.source import SourceTree

    changed = SourceTree(
        altered_wheel(sglang_wheel, tmp_path / "sglang-altered.whl", {path: (old, new)})
    )
    with pytest.raises(AssertionError):
        test(changed)
