"""The kit's checks of the deployment as a shared service: the rows of one call reach the
engine together, a retried call is computed once, two processors share one replica, a stopped
engine shows in ``health()``, and shutdown removes the deployment. The last two run last (a
subclass's tests inherit the kit's in this order): they stop the engine."""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest

import relayllm
from relayllm.data_context import keep_input_order
from relayllm.rows import Task
from relayllm.testing.kit.base import DISTINCT_PROMPTS, KIT_JOB, TIMEOUT_S, KitBase, _declared


class ReliabilityChecks(KitBase):
    """Concurrency, retries, sharing, engine down, undeploy."""

    def test_rows_of_one_call_run_concurrently(self, deployment):
        # The same 8 rows, once as one call and once as 8 one-row calls sent at once (which
        # the replica serves concurrently whatever the adapter does). Equal work under equal
        # load, back to back: only an adapter that serves a call's rows in turn makes the one
        # call several times slower. Best of two rounds each, against a noisy machine.
        task = self.text_task()
        params = {"max_tokens": 16}
        handle = self.deployed().handle()
        texts = list(DISTINCT_PROMPTS)
        self.call(self.requests(task, texts[:1], params))  # warm-up
        one_call, separate = [], []
        for _ in range(2):
            started = time.monotonic()
            self.call(self.requests(task, texts, params))
            one_call.append(time.monotonic() - started)
            started = time.monotonic()
            calls = [handle.process_batch.remote(self.requests(task, [t], params)) for t in texts]
            for response in calls:
                response.result(timeout_s=TIMEOUT_S)
            separate.append(time.monotonic() - started)
        together, apart = min(one_call), min(separate)
        assert together < 3 * apart + 0.5, (
            f"{len(texts)} rows took {together:.2f}s in one call but {apart:.2f}s as separate "
            f"calls at once: the adapter serves the rows of a call one after another instead of "
            f"handing them to the engine together"
        )

    def test_retried_call_is_not_computed_twice(self, deployment):
        task = self.text_task()
        params = {"temperature": 1.0, "max_tokens": 8}  # a recomputation would differ
        requests = self.requests(task, list(DISTINCT_PROMPTS[:4]), params)
        handle = self.deployed().handle()
        before = self.info()["rows"]
        first = handle.process_batch.remote(requests, job=KIT_JOB)
        again = handle.process_batch.remote(requests, job=KIT_JOB)  # a timed-out call's retry
        answers = [first.result(timeout_s=TIMEOUT_S), again.result(timeout_s=TIMEOUT_S)]
        later = handle.process_batch.remote(requests, job=KIT_JOB).result(timeout_s=TIMEOUT_S)
        computed = self.info()["rows"] - before
        assert computed == len(requests), (
            f"{len(requests)} rows sent three times were computed {computed} times over"
        )
        texts = [[r.get("generated_text") for r in a] for a in (*answers, later)]
        assert texts[0] == texts[1] == texts[2], texts

    def test_two_sequential_processors_share_one_deployment(self, deployment):
        import ray

        task = self.text_task()
        before = self.info()
        first, second = (self.processor(task, sampling_params={"max_tokens": 4}) for _ in range(2))

        keep_input_order()
        # A module-level function: a closure over the test instance would ship the adapter's
        # test module (and its helpers) to the Ray workers.
        ds = first(ray.data.from_items(self.rows(8, task))).map(functools.partial(_follow_up, task))
        out = second(ds).take_all()
        after = self.info()
        assert [r["id"] for r in out] == list(range(8))
        assert not self.errors(out), self.errors(out)
        assert all(isinstance(r["first_answer"], str) for r in out)
        assert after["replica_id"] == before["replica_id"], "a second replica or engine started"
        assert after["rows"] - before["rows"] == 16, "both processors' rows go to the one replica"

    def test_health_reports_engine_down(self, request):
        # The declarations are checked before the deployment starts (no engine needed).
        declared = _declared(self, "engine_down_untestable")
        if self.stop_engine is None:
            if declared:
                pytest.skip(f"engine_down_untestable: {declared}")
            pytest.fail(
                f"{type(self).__name__} defines no stop_engine(self, ref): define it to stop "
                f"the engine under the running deployment (the kit then checks that health() "
                f"reports it down), or declare engine_down_untestable = '<why a test cannot "
                f"stop this engine>'"
            )
        assert not declared, (
            f"{type(self).__name__} defines stop_engine and declares engine_down_untestable: "
            f"keep one"
        )
        request.getfixturevalue("deployment")
        ref = self.deployed()
        handle = ref.handle()
        # An adapter's own info() or health() may not name the replica: then only a failing
        # health() counts, as before.
        stopped = handle.info.remote().result(timeout_s=120).get("replica_id")
        self.stop_engine(ref)
        deadline = time.monotonic() + self.engine_down_within_s
        while True:
            try:
                health = handle.health.remote().result(timeout_s=60)
            except Exception:  # health() raising is how a replica reports a dead engine
                break
            if stopped is not None and health.get("replica_id") not in (None, stopped):
                # Serve's own health check (the same call) failed first and a new replica
                # took the stopped one's place: the engine was reported down.
                break
            assert time.monotonic() < deadline, f"health() still reports {health} after stop_engine"
            time.sleep(1)
        # test_undeploy, next, removes the deployment whose engine was stopped.

    def test_undeploy(self, deployment):
        running = {r.name: r for r in relayllm.list_deployments()}
        # Not deployed() when it runs: its engine may have been stopped by the test before.
        ref = running.get(self.deployment_name()) or self.deployed()
        assert ref.name in [r.name for r in relayllm.list_deployments()]
        assert relayllm.shutdown(ref.name) == [ref.name]
        assert ref.name not in [r.name for r in relayllm.list_deployments()]
        with pytest.raises(relayllm.DeploymentNotFoundError, match=ref.name):
            relayllm.get_deployment(ref.name)


def _follow_up(task: Task, row: dict[str, Any]) -> dict[str, Any]:
    """The second processor's row: asks about the first one's answer."""
    return {
        "id": row["id"],
        "first_answer": row["generated_text"],
        **KitBase.text_row(task, "Shorter: " + (row["generated_text"] or "")),
    }


__all__ = ["ReliabilityChecks"]
