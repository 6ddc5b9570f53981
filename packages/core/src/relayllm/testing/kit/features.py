"""The kit's checks of the optional request features a backend declares
(``Backend.features_for(options)``) beyond structured outputs: ``n`` samples, ``logprobs``,
``prompt_logprobs``, ``tools`` / ``tool_choice``, ``chat_template_kwargs`` and assistant prefill
(``continue_final_message``). Each runs when the backend declares its feature; otherwise the
kit checks that asking for it is refused before any row is sent, and skips, naming it."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from relayllm.testing.kit.base import DISTINCT_PROMPTS, KitBase, _declared, _logprob

#: The tool the tools check names in ``tool_choice`` (offered beside :data:`CLOCK_TOOL`).
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
CLOCK_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time now.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}
#: (question, the start of an answer) for assistant prefill.
PREFILLS = (
    ("What is the capital of France?", "The capital of France is"),
    ("Name three colors of the rainbow.", "Three colors of the rainbow are"),
    ("Count from one to five in words.", "Sure: one,"),
)


class FeatureChecks(KitBase):
    """One check per optional request feature (structured outputs apart)."""

    def test_n_samples(self, deployment):
        self._feature("n")
        task = self.text_task()
        params = {"n": 3, "temperature": 1.0, "max_tokens": 6}
        rows = [self.text_row(task, t, id=i) for i, t in enumerate(DISTINCT_PROMPTS[:4])]
        out = self.run(self.processor(task, sampling_params=params), rows)
        assert not self.errors(out), self.errors(out)
        for row in out:
            samples = row.get("samples")
            assert isinstance(samples, list) and len(samples) == 3, (
                f"row {row['id']} asked for n=3 and got samples {samples!r}"
            )
            for sample in samples:
                assert isinstance(sample.get("generated_text"), str), sample
                assert sample.get("finish_reason") in ("stop", "length"), sample
                count = sample.get("num_generated_tokens")
                assert count is None or count <= 6, f"a sample over max_tokens 6: {sample}"
            assert row["generated_text"] == samples[0]["generated_text"], (
                "the row's own generated_text is not its first sample's"
            )

    def test_logprobs_and_top_logprobs(self, deployment):
        self._feature("logprobs")
        task = self.text_task()
        top = 2
        asked: dict[str, Any] = (
            {"logprobs": True, "top_logprobs": top} if task == "chat" else {"logprobs": top}
        )
        rows = [self.text_row(task, t, id=i) for i, t in enumerate(DISTINCT_PROMPTS[:4])]
        out = self.run(self.processor(task, sampling_params={**asked, "max_tokens": 4}), rows)
        assert not self.errors(out), self.errors(out)
        for row in out:
            entries = row.get("logprobs")
            assert isinstance(entries, list) and entries, (
                f"row {row['id']} asked for {asked} and got logprobs {entries!r}"
            )
            assert len(entries) <= row["num_generated_tokens"], (
                f"{len(entries)} logprobs entries for {row['num_generated_tokens']} tokens"
            )
            for entry in entries:
                assert isinstance(entry.get("token"), str), entry
                assert _logprob(entry.get("logprob")), entry
                alternatives = entry.get("top_logprobs") or []
                assert len(alternatives) == top, (
                    f"top_logprobs {top} asked, an entry lists {len(alternatives)}: {entry}"
                )
                values = [a.get("logprob") for a in alternatives]
                assert all(_logprob(v) for v in values), entry
                assert all(a >= b - 1e-6 for a, b in itertools.pairwise(values)), (
                    f"top_logprobs not most likely first: {entry}"
                )

    def test_prompt_logprobs(self, deployment):
        # One entry per prompt token (the first may have no logprob: nothing precedes it),
        # each with the most likely alternative at its place.
        self._feature("prompt_logprobs")
        task = self.text_task()
        rows = [self.text_row(task, t, id=i) for i, t in enumerate(DISTINCT_PROMPTS[:4])]
        params = {"prompt_logprobs": 1, "max_tokens": 2}
        out = self.run(self.processor(task, sampling_params=params), rows)
        assert not self.errors(out), self.errors(out)
        for row in out:
            entries = row.get("prompt_logprobs")
            assert isinstance(entries, list) and len(entries) == row["num_input_tokens"], (
                f"row {row['id']} asked for prompt_logprobs 1 with {row['num_input_tokens']} "
                f"prompt tokens and got prompt_logprobs {str(entries)[:300]}"
            )
            for place, entry in enumerate(entries[1:], start=1):
                assert _logprob(entry.get("logprob")), f"prompt token {place}: {entry}"
                alternatives = entry.get("top_logprobs") or []
                assert len(alternatives) == 1 and _logprob(alternatives[0].get("logprob")), (
                    f"prompt_logprobs 1 asked, prompt token {place} lists {alternatives}"
                )

    def test_tools_and_tool_choice(self, deployment):
        # Two tools offered, one named in tool_choice: every row calls it, with JSON arguments.
        self._feature("tools")
        task = self.chat_task("tools")
        choice = {"type": "function", "function": {"name": "get_weather"}}
        params = {"tools": [CLOCK_TOOL, WEATHER_TOOL], "tool_choice": choice, "max_tokens": 64}
        texts = ["What is the weather in Paris now?", "Is it raining in Rome today?"]
        rows = [self.text_row(task, t, id=i) for i, t in enumerate(texts)]
        out = self.run(self.processor(task, sampling_params=params), rows)
        assert not self.errors(out), self.errors(out)
        for row in out:
            calls = row.get("tool_calls")
            assert isinstance(calls, list) and len(calls) == 1, (
                f"row {row['id']} named tool get_weather in tool_choice and got tool_calls "
                f"{calls!r} (text {row['generated_text']!r}, {row['finish_reason']})"
            )
            function = calls[0].get("function") or {}
            assert calls[0].get("type") == "function" and function.get("name") == "get_weather", (
                f"row {row['id']} named tool get_weather in tool_choice and called {calls[0]}"
            )
            try:
                json.loads(str(function.get("arguments")))
            except (TypeError, ValueError) as exc:
                pytest.fail(f"row {row['id']}'s call has arguments that are not JSON: {exc}")

    def test_chat_template_kwargs(self, request):
        # The kwargs this model's template reads (chat_template_kwargs_probe) change the
        # prompt it renders: a different num_input_tokens for the same messages. The
        # declarations are checked before the deployment starts (a refused one starts nothing).
        probe = self.chat_template_kwargs_probe
        declared = _declared(self, "chat_template_kwargs_untestable")
        if "chat_template_kwargs" in self.served_features() and "chat" in self.served_tasks():
            if probe is None:
                if declared:
                    pytest.skip(f"chat_template_kwargs_untestable: {declared}")
                pytest.fail(
                    f"{type(self).__name__}: the backend declares chat_template_kwargs; declare "
                    f"chat_template_kwargs_probe = {{...}} (keyword arguments this model's chat "
                    f"template reads, which change the prompt), or "
                    f"chat_template_kwargs_untestable = '<why no keyword argument changes its "
                    f"template>'"
                )
            assert not declared, (
                f"{type(self).__name__} declares chat_template_kwargs_probe and "
                f"chat_template_kwargs_untestable: keep one"
            )
        request.getfixturevalue("deployment")
        self._feature("chat_template_kwargs")
        task = self.chat_task("chat_template_kwargs")
        texts = list(DISTINCT_PROMPTS[:4])
        plain = self.call(self.requests(task, texts, {"max_tokens": 2}))
        params = {"chat_template_kwargs": probe, "max_tokens": 2}
        given = self.call(self.requests(task, texts, params))
        assert not self.errors(plain + given), self.errors(plain + given)
        before = [r["num_input_tokens"] for r in plain]
        after = [r["num_input_tokens"] for r in given]
        assert all(a != b for a, b in zip(before, after, strict=True)), (
            f"chat_template_kwargs {probe} left the prompt as it was: num_input_tokens "
            f"{before} without them, {after} with them (the template never saw them)"
        )

    def test_continue_final_message(self, deployment):
        # Continuing the final assistant message leaves out its end and a new turn's start,
        # which answering it adds: a shorter prompt, with an answer.
        self._feature("continue_final_message")
        task = self.chat_task("continue_final_message")
        chats = [
            [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            for q, a in PREFILLS
        ]
        answered = self.call(self.requests(task, chats, {"max_tokens": 8}))
        params = {"continue_final_message": True, "max_tokens": 8}
        continued = self.call(self.requests(task, chats, params))
        assert not self.errors(answered + continued), self.errors(answered + continued)
        for i, (a, c) in enumerate(zip(answered, continued, strict=True)):
            shorter, longer = c.get("num_input_tokens") or 0, a.get("num_input_tokens") or 0
            assert 0 < shorter < longer, (
                f"chat {i} ending in an assistant message: continue_final_message gave a "
                f"prompt of {shorter} tokens, answering it {longer}: the final message was "
                f"not continued (its end and a new turn stayed in)"
            )
            assert isinstance(c.get("generated_text"), str), c
            assert (c.get("num_generated_tokens") or 0) > 0, c


__all__ = ["CLOCK_TOOL", "PREFILLS", "WEATHER_TOOL", "FeatureChecks"]
