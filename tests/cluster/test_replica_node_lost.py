"""A deployment with an HTTP front, one replica on each worker node, loses a node: an OpenAI
client through Serve's proxy sees at most the requests in flight at the loss fail, each with a
retryable status, and the requests after it are answered by the replica left. Then, while the
deployment is paused and serves updated weights, its last node is lost as a new one joins: the
replacement replica on the new node comes up paused and with those weights before it takes a
row (the control state lives in an actor, not in the replicas)."""

from __future__ import annotations

import threading
import time

import pytest
from support import echo_deployment, free_port, wait_for

CLIENTS = 4
#: What a client may get from a request the loss interrupted: what an OpenAI client retries
#: by itself (every 5xx status, a dropped connection). Serve's proxy answers 500 for a request
#: whose replica died under it (measured; not 503), which the client retries all the same.
RETRYABLE = ("APIConnectionError", "APITimeoutError")


@pytest.fixture(scope="module")
def front(nodes):
    from ray import serve

    from relayllm.cluster import connect

    connect(nodes.address)
    serve.shutdown()  # Serve takes its HTTP proxy only while nothing runs
    port = free_port()
    with echo_deployment(
        "front",
        num_replicas=2,
        options={"delay_s": 0.2},
        # One replica per worker node: each has one `engine` slot, the head none.
        ray_actor_options={"num_cpus": 0.1, "resources": {"engine": 1}},
        http={"port": port},
        health_check_period_s=1,
        health_check_timeout_s=5,
    ):
        yield f"http://127.0.0.1:{port}/front/v1"


class Clients:
    """``CLIENTS`` threads sending chat requests one after another, each outcome recorded
    with when it was sent and when it ended (``time.monotonic`` of this process)."""

    def __init__(self, url: str) -> None:
        import openai

        self.api = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        self.outcomes: list[tuple[float, float, object]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(i,)) for i in range(CLIENTS)]
        for thread in self.threads:
            thread.start()

    def _loop(self, i: int) -> None:
        import openai

        n = 0
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                self.api.chat.completions.create(
                    model="front", messages=[{"role": "user", "content": f"client {i} {n}"}]
                )
                outcome: object = 200
            except openai.APIStatusError as exc:
                outcome = exc.status_code
            except openai.APIConnectionError as exc:
                outcome = type(exc).__name__
            self.outcomes.append((sent, time.monotonic(), outcome))
            n += 1

    def ok(self) -> int:
        return sum(1 for *_, outcome in self.outcomes if outcome == 200)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)


@pytest.mark.timeout(600)
def test_requests_to_the_lost_replica_fail_over(nodes, front):
    clients = Clients(front)
    try:
        wait_for(lambda: clients.ok() >= 20, "requests answered before the loss")
        before = nodes.replicas("front")
        assert sorted(before.values()) == ["node1", "node2"], before
        killed = time.monotonic()
        nodes.kill("node1")
        done = time.monotonic()
        wait_for(
            lambda: sum(1 for s, _, o in clients.outcomes if s > done and o == 200) >= 40,
            "requests answered after the loss",
        )
        # Answered by the replica that was left, not by a replacement started meanwhile (no
        # node has room for one): the requests failed over, they did not wait for a new one.
        left = nodes.replicas("front")
        assert set(left) == {name for name, node in before.items() if node == "node2"}, left
    finally:
        clients.finish()
    failed = [(s, e, o) for s, e, o in clients.outcomes if o != 200]
    in_flight = [o for s, e, o in clients.outcomes if s <= killed <= e]
    assert len(failed) <= CLIENTS, ("more failures than requests in flight at the loss", failed)
    assert all(o in RETRYABLE or (isinstance(o, int) and o >= 500) for *_, o in failed), failed
    print(f"\n{len(clients.outcomes)} requests, {len(failed)} failed, {len(in_flight)} in flight")


@pytest.mark.timeout(600)
def test_a_replacement_on_a_new_node_adopts_the_control_state_before_a_row(nodes, front, tmp_path):
    import ray

    import relayllm
    from relayllm import ProcessorConfig, build_processor
    from relayllm.serving.control_state import STATE_NAMESPACE, state_actor_name
    from relayllm.testing.echo import write_echo_checkpoint

    control = relayllm.control("front")
    checkpoint = write_echo_checkpoint(tmp_path / "v2", "v2")  # a path every node reaches
    control.update_weights(checkpoint, version="v2")
    control.pause()
    # The replicas created the state as they started, from the worker nodes: it must sit on
    # the head, or losing a worker node loses it (and the replacement comes up unpaused).
    assert nodes.actor_node(state_actor_name("front"), STATE_NAMESPACE) == "head"
    nodes.kill("node2")  # node1 is gone too: no replica runs until node3 joins
    nodes.add("node3")
    wait_for(lambda: set(nodes.replicas("front").values()) == {"node3"}, "a replica on node3")
    wait_for(lambda: len(control.replicas()) == 1, "the replacement answers", timeout_s=120)

    def adopted() -> bool:  # it reads the state as it starts (its gate closed meanwhile)
        (info,) = control.replicas().values()
        return info["paused"] == "wait" and info["weight_version"] == "v2"

    wait_for(adopted, "the replacement paused, on weights v2", timeout_s=60)
    # Rows sent now wait at the replacement's gate: none runs until the resume.
    out: dict = {}
    proc = build_processor(
        ProcessorConfig(deployment="front", task="completion", batch_size=10, timeout_s=120)
    )
    job = threading.Thread(
        target=lambda: out.update(
            rows=proc(
                ray.data.from_items([{"id": i, "prompt": f"row {i}"} for i in range(50)])
            ).take_all()
        )
    )
    job.start()
    wait_for(lambda: next(iter(control.replicas().values()))["ongoing"] > 0, "rows at the gate")
    assert next(iter(control.replicas().values()))["rows"] == 0, "no row ran while paused"
    control.resume()
    job.join(300)
    rows = out["rows"]
    assert len(rows) == 50 and not any(r["error"] for r in rows)
    assert {r["weight_version"] for r in rows} == {"v2"}, "every row on the adopted weights"
    assert all(r["generated_text"].startswith("[v2]") for r in rows)
