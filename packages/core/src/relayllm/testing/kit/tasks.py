"""The kit's checks of what any text deployment does: say it is healthy and what it serves,
answer each row on its own row within its own budget, fail alone the row its engine refuses,
and serve (or refuse up front) each task."""

from __future__ import annotations

import math

import pytest

import relayllm
from relayllm.testing.kit.base import DISTINCT_PROMPTS, TIMEOUT_S, KitBase, _declared

#: Per-row max_tokens: every row's budget differs from both neighbours'.
BUDGETS = (1, 4, 2, 5, 3, 6, 2, 4)


class TaskChecks(KitBase):
    """Health, rows on their own rows, a refused row, the tasks."""

    def test_health_and_info(self, deployment):
        handle = self.deployed().handle()
        assert handle.health.remote().result(timeout_s=TIMEOUT_S)["ok"] is True
        info = self.info()
        assert info["backend"] == self.backend
        assert info["replica_id"]
        assert sorted(info["tasks"]) == sorted(self.served_tasks()), info["tasks"]

    def test_each_row_gets_its_own_answer(self, deployment):
        task = self.text_task()
        texts = list(DISTINCT_PROMPTS)
        alone = [self.call(self.requests(task, [t], {"max_tokens": 6}))[0] for t in texts]
        together = self.call(self.requests(task, texts, {"max_tokens": 6}))
        assert not self.errors(alone + together), self.errors(alone + together)
        answers = [r["generated_text"] for r in alone]
        assert len(set(answers)) >= len(texts) // 2, (
            f"distinct prompts got too few distinct answers to tell rows apart: {answers}"
        )
        batched = [r["generated_text"] for r in together]
        shown = "\n".join(f"  {a!r} vs {b!r}" for a, b in zip(answers, batched, strict=True))
        same = sum(a == b for a, b in zip(answers, batched, strict=True))
        assert same >= math.ceil(0.75 * len(texts)), (
            "answers in one call differ from the same rows sent alone (on the wrong row?):\n"
            + shown
        )
        # The tolerance is for numerics that differ with the batch, which give a row a new
        # answer, never another row's: an answer another prompt gets alone is on the wrong row.
        moved = [
            (i, j)
            for i, answer in enumerate(batched)
            for j, other in enumerate(answers)
            if answer != answers[i] and answer == other
        ]
        assert not moved, (
            "answers in one call are other rows' answers (on the wrong row?): "
            + ", ".join(f"row {i} got row {j}'s" for i, j in moved)
            + "\n"
            + shown
        )

        rows = [
            self.text_row(task, t, id=i, sampling_params={"max_tokens": b})
            for i, (t, b) in enumerate(zip(texts, BUDGETS, strict=False))
        ]
        out = self.run(self.processor(task, batch_size=len(rows)), rows)
        assert [r["id"] for r in out] == list(range(len(rows)))
        assert not self.errors(out), self.errors(out)
        for row, budget in zip(out, BUDGETS, strict=False):
            generated, finish = row["num_generated_tokens"], row["finish_reason"]
            assert isinstance(generated, int) and 0 < generated <= budget, (
                f"row {row['id']} (max_tokens {budget}) generated {generated} tokens"
            )
            assert finish in ("stop", "length"), finish
            assert finish != "length" or generated == budget, (
                f"row {row['id']} stopped for length at {generated} tokens, its budget is {budget}"
            )
        assert any(r["finish_reason"] == "length" for r in out), "no row reached its budget"

    def test_engine_refusal_fails_only_that_row(self, request):
        # The declarations are checked before the deployment starts (no engine needed).
        declared = _declared(self, "refuses_no_rows")
        refusal_given = self.context_length is not None or (
            type(self).refused_row is not KitBase.refused_row
        )
        if declared:
            assert not refusal_given, (
                f"{type(self).__name__} declares refuses_no_rows and also how its engine "
                f"refuses a row (context_length or refused_row): keep one"
            )
            pytest.skip(f"refuses_no_rows: {declared}")
        if not refusal_given:
            self.refused_row(self.text_task())  # fails, saying what to declare
        request.getfixturevalue("deployment")
        task = self.text_task()
        rows = [self.text_row(task, t, id=i) for i, t in enumerate(DISTINCT_PROMPTS[:6])]
        rows.insert(2, {**self.refused_row(task), "id": "refused"})
        processor = self.processor(task, batch_size=len(rows), sampling_params={"max_tokens": 4})
        out = self.run(processor, rows)
        by_id = {r["id"]: r for r in out}
        assert by_id["refused"]["error"], "the row the engine should refuse got no error"
        others = [r for r in out if r["id"] != "refused"]
        assert not self.errors(others), (
            f"a refusal of one row failed others of its call: {self.errors(others)}"
        )
        assert all(isinstance(r["generated_text"], str) and r["generated_text"] for r in others)

    def _task_check(self, task: str) -> bool:
        """True if the deployment serves ``task``; else checks that it is refused before any
        row is sent -- the check a stage runs when it starts -- naming backend and task."""
        if task in self.served_tasks():
            return True
        from relayllm.deployments import check_task_served

        self.deployed()
        with pytest.raises(relayllm.ConfigError, match=rf"does not serve task '{task}'") as caught:
            check_task_served(self.deployment_name(), task)
        assert f"backend {self.backend!r}" in str(caught.value)
        return False

    def test_chat(self, deployment):
        if self._task_check("chat"):
            out = self.run(self.processor("chat", sampling_params={"max_tokens": 4}), self.rows(4))
            assert not self.errors(out), self.errors(out)
            assert all(r["generated_text"] and r["num_generated_tokens"] > 0 for r in out), out

    def test_completion(self, deployment):
        if self._task_check("completion"):
            out = self.run(
                self.processor("completion", sampling_params={"max_tokens": 4}),
                self.rows(4, "completion"),
            )
            assert not self.errors(out), self.errors(out)
            assert all(r["generated_text"] and r["num_generated_tokens"] > 0 for r in out), out

    def test_embedding(self, deployment):
        if not self._task_check("embedding"):
            return
        texts = [
            "The cat sat on the mat.",
            "Stock prices fell sharply today.",
            "A recipe for tomato soup.",
            "The cat sat on the mat.",
        ]
        rows = [self.text_row("embedding", t, id=i) for i, t in enumerate(texts)]
        out = self.run(self.processor("embedding"), rows)
        assert not self.errors(out), self.errors(out)
        vectors = [list(r["embedding"]) for r in out]
        assert len({len(v) for v in vectors}) == 1 and vectors[0], [len(v) for v in vectors]
        assert all(math.isfinite(x) for v in vectors for x in v)
        assert _close(vectors[0], vectors[3]), "equal inputs got different embeddings"
        for i in range(3):
            for j in range(i + 1, 3):
                assert not _close(vectors[i], vectors[j]), f"inputs {i} and {j} got one embedding"


def _close(a: list[float], b: list[float]) -> bool:
    scale = max(1e-6, max(abs(x) for x in a + b))
    return len(a) == len(b) and all(abs(x - y) <= 1e-3 * scale for x, y in zip(a, b, strict=True))


__all__ = ["BUDGETS", "TaskChecks"]
