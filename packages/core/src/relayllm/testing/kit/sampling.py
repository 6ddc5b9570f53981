"""The kit's checks of the sampling parameters every backend takes: ``max_tokens`` and
``max_completion_tokens``, ``temperature``, ``seed``, ``top_p``, ``stop`` (a list or a plain
string) and the two repetition penalties.

Engines' greedy answers may differ a little between identical calls (batched numerics), so
answers are compared "3 of 4 equal"; a check that an answer *changed* compares answers each
seen twice, so that noise cannot pass it.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from relayllm.testing.kit.base import (
    DISTINCT_PROMPTS,
    KitBase,
    _declared,
    _fresh_ids,
    _mostly_equal,
    _pairs,
)

#: Prompts that invite a repetitive answer (a presence or frequency penalty changes it).
REPEAT_PROMPTS = (
    "Repeat after me: apple apple apple apple apple apple apple apple apple apple",
    "Say the word go eight times: go go go go go go go go",
    "Continue the pattern: la la la la la la la la la la la la",
    "Write the word seven five times: seven seven seven seven seven",
)
#: Prompts with long answers, for the checks that compare answers.
LONG_PROMPTS = tuple(t + " Answer at length." for t in DISTINCT_PROMPTS)


class SamplingChecks(KitBase):
    """One check per sampling parameter the row protocol promises."""

    def test_max_tokens_honoured(self, deployment):
        self._budget_check("max_tokens")

    def test_max_completion_tokens_honoured(self, deployment):
        # OpenAI's newer name for max_tokens: an adapter that reads only the old one lets
        # every answer run to its end.
        self._budget_check("max_completion_tokens")

    def _budget_check(self, name: str) -> None:
        task = self.text_task()
        rows = [self.text_row(task, t, id=i) for i, t in enumerate(LONG_PROMPTS)]
        out = self.run(self.processor(task, sampling_params={name: 3}), rows)
        refused = self._refused(out, name) if name != "max_tokens" else None
        if refused:
            pytest.skip(f"{self.backend} refuses {name} (the shared policy): {refused}")
        assert not self.errors(out), self.errors(out)
        counts = [r["num_generated_tokens"] for r in out]
        assert all(isinstance(c, int) and 0 < c <= 3 for c in counts), (
            f"{name} 3 asked, the rows generated {counts} tokens"
        )
        finishes = [r["finish_reason"] for r in out]
        assert "length" in finishes, f"{name} 3 asked, no row stopped for length: {finishes}"

    def test_temperature_zero_is_deterministic(self, deployment):
        task = self.text_task()
        params = {"temperature": 0.0, "max_tokens": 12}
        texts = list(LONG_PROMPTS)
        first, again = (self._texts(self.call(self.requests(task, texts, params))) for _ in "12")
        _mostly_equal(first, again, "the same rows at temperature 0, sent twice")

    def test_temperature_one_varies_without_seed(self, deployment):
        # An adapter that always decodes greedily passes the temperature 0, seed and top_p
        # checks: sampling without a seed must give most rows a new answer call to call
        # (greedy noise is bounded by the "3 of 4 equal" the other checks allow).
        task = self.text_task()
        texts = list(LONG_PROMPTS)
        requests = self.requests(task, texts, {"temperature": 1.0, "max_tokens": 12})
        for request in requests:
            request["sampling_params"].pop("seed", None)
        first, again = (self._texts(self.call(_fresh_ids(requests))) for _ in "12")
        declared = _declared(self, "greedy_only")
        if declared:
            greedy = self._texts(self.call(self.requests(task, texts, {"max_tokens": 12})))
            what = "greedy_only is declared, but temperature 0 and temperature 1"
            _mostly_equal(greedy, first, what)
            pytest.skip(f"greedy_only: {declared}")
        varied = sum(a != b for a, b in zip(first, again, strict=True))
        assert varied >= len(texts) // 2, (
            f"at temperature 1 without a seed, {varied} of {len(texts)} rows got a new answer "
            f"from one call to the next (a sampling engine gives most rows a new one): the "
            f"adapter decodes greedily whatever the temperature (an engine with one answer "
            f"per prompt declares greedy_only = '<why>'):\n" + _pairs(first, again)
        )

    def test_seed_makes_sampling_reproducible(self, deployment):
        # Each row its own seed, at temperature 1: the same call twice gives the same answers.
        # (Different seeds giving different answers depends on the model: not checked.)
        task = self.text_task()
        requests = self.requests(task, list(LONG_PROMPTS), {"temperature": 1.0, "max_tokens": 12})
        for i, request in enumerate(requests):
            request["sampling_params"] = {**request["sampling_params"], "seed": 1234 + i}
        first, again = (self._texts(self.call(_fresh_ids(requests))) for _ in "12")
        _mostly_equal(first, again, "the same seeded rows at temperature 1, sent twice")

    def test_small_top_p_is_greedy(self, deployment):
        # A nucleus this small holds only the most likely token: sampling at temperature 1
        # then gives the greedy (temperature 0) answer.
        task = self.text_task()
        texts = list(LONG_PROMPTS)
        greedy = self._texts(self.call(self.requests(task, texts, {"max_tokens": 12})))
        params = {"temperature": 1.0, "top_p": 1e-6, "max_tokens": 12}
        nucleus = self._texts(self.call(self.requests(task, texts, params)))
        _mostly_equal(greedy, nucleus, "temperature 0 vs temperature 1 with top_p 1e-6")

    def test_stop_sequences_honoured(self, deployment):
        self._stop_check(as_string=False)

    def test_stop_string_honoured(self, deployment):
        # ``stop`` may be one plain string: an adapter that reads only a list ignores it.
        self._stop_check(as_string=True)

    def _stop_check(self, as_string: bool) -> None:
        """Each row stops at a word of its own greedy answer: the answer then never contains
        the stop string, and (3 of 4) finishes for "stop", the greedy answer cut there."""
        task = self.text_task()
        texts = list(DISTINCT_PROMPTS)
        full = self._texts(self.call(self.requests(task, texts, {"max_tokens": 16})))
        stops = [_stop_string(text) for text in full]
        assert sum(s is not None for s in stops) >= 2, (
            f"the greedy answers are too short to pick stop strings from: {full}"
        )
        given = "a plain string" if as_string else "a list"
        rows = [
            self.text_row(task, t, id=i, sampling_params={"stop": s if as_string else [s]})
            if s
            else self.text_row(task, t, id=i)
            for i, (t, s) in enumerate(zip(texts, stops, strict=True))
        ]
        processor = self.processor(task, batch_size=len(rows), sampling_params={"max_tokens": 16})
        out = self.run(processor, rows)
        assert not self.errors(out), self.errors(out)
        stopped = [(r, s, f) for r, s, f in zip(out, stops, full, strict=True) if s]
        for row, stop, _ in stopped:
            assert stop not in (row["generated_text"] or ""), (
                f"row {row['id']} has stop {stop!r} ({given}) but its answer contains it: "
                f"{row['generated_text']!r}"
            )
        cut = [
            r["finish_reason"] == "stop"
            and (r["generated_text"] or "").rstrip() == f[: f.find(s)].rstrip()
            for r, s, f in stopped
        ]
        assert sum(cut) >= math.ceil(0.75 * len(stopped)), (
            f"rows with a stop string ({given}) from their own greedy answer did not end there "
            f"(finish_reason 'stop', the greedy answer cut before the stop string):\n"
            + "\n".join(
                f"  stop {s!r}: {r['generated_text']!r} ({r['finish_reason']}) vs {f!r}"
                for r, s, f in stopped
            )
        )

    def test_presence_penalty_honoured(self, deployment):
        self._penalty_check("presence_penalty")

    def test_frequency_penalty_honoured(self, deployment):
        self._penalty_check("frequency_penalty")

    def _penalty_check(self, name: str) -> None:
        """A strong penalty changes the greedy answer to a prompt that invites repetition (on
        at least one prompt), each answer seen twice: the plain one and the penalised one
        each the same across two calls, and different from each other. An adapter whose
        engine has no such penalty refuses it with the shared policy's error
        (``check_sampling_support``): then nothing to check."""
        task = self.text_task()
        texts = list(REPEAT_PROMPTS)
        penalised = [self.call(self.requests(task, texts, {name: 2.0, "max_tokens": 16}))]
        refused = self._refused(penalised[0], name)
        if refused:
            pytest.skip(f"{self.backend} refuses {name} (the shared policy): {refused}")
        plain = [self._texts(self.call(self.requests(task, texts, {"max_tokens": 16})))]
        plain.append(self._texts(self.call(self.requests(task, texts, {"max_tokens": 16}))))
        penalised.append(self.call(self.requests(task, texts, {name: 2.0, "max_tokens": 16})))
        after = [self._texts(p) for p in penalised]
        stable = [i for i in range(len(texts)) if plain[0][i] == plain[1][i]]
        assert stable, (
            f"no prompt got the same greedy answer twice, so the effect of {name} cannot be "
            f"told from the engine's run-to-run noise:\n" + _pairs(plain[0], plain[1])
        )
        changed = [i for i in stable if after[0][i] == after[1][i] != plain[0][i]]
        assert changed, (
            f"{name} 2.0 changed no answer to prompts that invite repetition (of those whose "
            f"greedy answer is the same twice, none got one penalised answer twice, different "
            f"from it):\n"
            + "\n".join(f"  {plain[0][i]!r} -> {after[0][i]!r} / {after[1][i]!r}" for i in stable)
        )


def _stop_string(text: Any) -> str | None:
    """A word of ``text`` (not its first or last) whose first occurrence is where it stands:
    stopping there cuts the text at that word."""
    if not isinstance(text, str):
        return None
    words = list(re.finditer(r"\S+", text))
    for word in words[1:-1]:
        if len(word.group()) >= 2 and text.find(word.group()) == word.start():
            return word.group()
    return None


__all__ = ["LONG_PROMPTS", "REPEAT_PROMPTS", "SamplingChecks"]
