"""Affinity routing on a real cluster, judged by echo's simulated prefix cache (the counters an
engine reports): a row's steps stay on one replica, a hot key stays within the load bound, a
replica killed mid-job loses no row. One cluster for the module (``ray_session``); echo's
replicas reserve no CPU, so 4 fit beside the stage on 2 cores. The policy alone, without
Ray: tests/unit/core/test_routing.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
import ray

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor, compat
from relayllm.cli.run import format_summary
from relayllm.pipelines import parse_pipeline, run_pipeline
from relayllm.testing.prometheus import wait_for_sample

pytestmark = pytest.mark.usefixtures("ray_session")

CACHE = {"prefix_cache_blocks": 100_000, "prefix_block_words": 16}


def _pipeline(name: str, replicas: int, routing: str) -> str:
    """answer -> critique -> rewrite on one deployment, each step repeating the row's
    document and its earlier turns (the multi-turn example's shape)."""
    return f"""\
deployments:
  - name: {name}
    backend: echo
    num_replicas: {replicas}
    routing: {routing}
    options: {json.dumps(CACHE)}
input: {{path: rows.jsonl}}
steps:
  - name: answer
    deployment: {name}
    messages: [{{role: user, content: "{{doc}} {{question}}"}}]
    sampling_params: {{max_tokens: 8}}
    batch_size: 8
    output_column: answer
  - name: critique
    deployment: {name}
    messages:
      - {{role: user, content: "{{doc}} {{question}}"}}
      - {{role: assistant, content: "{{answer}}"}}
      - {{role: user, content: "what does the answer leave out"}}
    sampling_params: {{max_tokens: 8}}
    batch_size: 8
    output_column: critique
  - name: rewrite
    deployment: {name}
    messages:
      - {{role: user, content: "{{doc}} {{question}}"}}
      - {{role: assistant, content: "{{answer}}"}}
      - {{role: user, content: "a reviewer said {{critique}} rewrite it"}}
    sampling_params: {{max_tokens: 8}}
    batch_size: 8
    output_column: final
"""


def _replicas(name: str) -> dict[str, dict]:
    return relayllm.control(name).replicas()


def _cache(infos: dict[str, dict]) -> tuple[int, int, int]:
    """(prompt tokens, of them found cached, prefilled) over the replicas."""
    queries = sum(i["metrics"]["prefix_cache_queries"] for i in infos.values())
    hits = sum(i["metrics"]["prefix_cache_hits"] for i in infos.values())
    prefilled = sum(i["metrics"]["engine_step_tokens"]["prefilled"] for i in infos.values())
    return queries, hits, prefilled


def _run_pipeline(tmp_path, name: str, replicas: int, routing: str):
    rows = [
        {"question": f"question {i}?", "doc": " ".join(f"d{i}w{j}" for j in range(200))}
        for i in range(48)
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pipeline = parse_pipeline(_pipeline(name, replicas, routing), "p.yaml", tmp_path)
    out: list[dict] = []
    try:
        summary = run_pipeline(pipeline, sink=out.extend, keep_deployments=True)
        infos = _replicas(name)
    finally:
        relayllm.shutdown(name)
    assert len(out) == 48 and all(r["error"] is None for r in out)
    # The run summary gives the engines' own figures over the run, per deployment.
    engines = summary.engines[name]
    assert (engines["prompt_tokens"], engines["cached_tokens"], engines["prefilled_tokens"]) == (
        _cache(infos)
    )
    assert f"{name} (steps answer, critique, rewrite): prefix-cache hit rate" in (
        format_summary(summary)
    )
    return infos


def test_a_rows_steps_stay_on_the_replica_that_holds_its_prefix(tmp_path):
    # One name for both runs: the stage's worker processes outlive a run, and a redeploy of
    # the name (with another router here) must reach them.
    one = _cache(_run_pipeline(tmp_path, "aff-steps", 1, "default"))
    infos = _run_pipeline(tmp_path, "aff-steps", 4, "affinity")
    four = _cache(infos)
    assert one[0] == four[0]  # the same prompts
    rate_one, rate_four = one[1] / one[0], four[1] / four[0]
    assert rate_one > 0.5
    # Within 0.9x the hit rate of one replica, and at most 1.1x its prefilled tokens (Serve's
    # default routing: about a quarter of the later steps find their prefix).
    assert rate_four >= 0.9 * rate_one, (rate_one, rate_four)
    assert four[2] <= 1.1 * one[2], (one[2], four[2])
    rows = [i["rows"] for i in infos.values()]
    assert len(rows) == 4 and min(rows) > 0  # every replica served rows


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it, in a driver of its own, on this module's cluster."""
    address = ray.get_runtime_context().gcs_address
    done = subprocess.run(
        [sys.executable, "-m", "relayllm.cli", *args, "--address", address],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RELAYLLM_ECHO_BACKEND": "1"},
    )
    assert done.returncode == 0, done.stderr
    return done


def test_status_lists_every_replica_with_its_node_rows_and_hit_rate(tmp_path):
    name = "aff-status"
    relayllm.deploy(DeploymentConfig(name=name, backend="echo", num_replicas=3, options=CACHE))
    try:
        config = ProcessorConfig(deployment=name, task="completion", batch_size=2)
        rows = [{"id": i, "prompt": "shared words " * 20 + str(i)} for i in range(24)]
        build_processor(config)(ray.data.from_items(rows)).take_all()
        listed = _cli("status", "--json").stdout
        shown = _cli("status").stdout
        lines = [
            {"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions"}
            | {"body": {"prompt": "shared words " * 20 + str(i)}}
            for i in range(8)
        ]
        (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        batch = _cli(
            "batch", str(tmp_path / "in.jsonl"), "--deployment", name,
            "--output", str(tmp_path / "out.jsonl"),
        )  # fmt: skip
        # The same per replica in the exported metrics: each replica's series of its own.
        for info in _replicas(name).values():
            queries = info["metrics"]["prefix_cache_queries"]
            if queries:
                wait_for_sample(
                    "ray_relayllm_prefix_cache_queries_total",
                    lambda v, q=queries: v == q,
                    deployment=name,
                    replica=info["replica_id"],
                )
    finally:
        relayllm.shutdown(name)
    entry = next(d for d in json.loads(listed) if d.get("name") == name)
    replicas = entry["replicas"]
    node = ray.get_runtime_context().get_node_id()
    assert len(replicas) == 3 and {r["node_id"] for r in replicas} == {node}
    assert sum(r["rows"] for r in replicas) == entry["rows"] == 24
    assert all(r["node_ip"] and r["prefix_cache_queries"] > 0 for r in replicas if r["rows"])
    lines = [line.split() for line in shown.splitlines() if line.startswith(name)]
    replica_lines = [line for line in lines if line[1] in {r["replica"] for r in replicas}]
    assert len(replica_lines) == 3  # one line per replica: name, replica, node, ...
    # relayllm batch's summary: the engines' own figures over its run.
    # (Each deployment has two lines: its tokens, then the engines' figures.)
    mine = [line for line in batch.stderr.splitlines() if line.startswith(f"{name}: ")]
    (summary,) = [line for line in mine if "prefix-cache" in line]
    assert summary.startswith(f"{name}: prefix-cache hit rate"), summary
    assert sum(line.endswith(" completion tokens") for line in mine) == 1, mine
    assert "prompt tokens prefilled" in summary and summary.endswith(", 3 replica(s)"), summary


def _skewed_rows(n: int) -> list[dict]:
    """A quarter of the rows share one session key; the rest each have their own."""
    return [
        {"session": "hot" if i % 4 == 0 else f"s{i}", "prompt": f"row {i} " + "w " * 20}
        for i in range(n)
    ]


def test_a_hot_key_spills_and_no_replica_passes_the_bound():
    name = "aff-skew"
    relayllm.deploy(
        DeploymentConfig(
            name=name,
            backend="echo",
            num_replicas=4,
            routing="affinity",
            max_ongoing_requests=64,
            options={"delay_s": 0.05, **CACHE},
        )
    )
    try:
        config = ProcessorConfig(
            deployment=name,
            task="completion",
            batch_size=4,
            max_in_flight_batches=16,
            affinity_column="session",
        )
        out = build_processor(config)(ray.data.from_items(_skewed_rows(1024))).take_all()
        infos = _replicas(name)
    finally:
        relayllm.shutdown(name)
    assert len(out) == 1024 and all(r["error"] is None for r in out)
    rows = sorted(i["rows"] for i in infos.values())
    mean = sum(rows) / len(rows)
    # The bound holds on the rows each router has in flight when it places a call; the rows a
    # replica served over the whole job can pass it by a little (each stage task routes its
    # own calls). Without the bound the hot key's replica serves about 1.7x the mean.
    assert rows[-1] <= 1.1 * 1.25 * mean, rows  # docs/routing.md: within 1.25x the mean


def test_a_replica_killed_mid_job_gives_its_keys_to_the_others_and_loses_no_row():
    name = "aff-kill"
    relayllm.deploy(
        DeploymentConfig(
            name=name,
            backend="echo",
            num_replicas=3,
            routing="affinity",
            health_check_period_s=1,
            options={"delay_s": 0.05, **CACHE},
        )
    )
    app = f"relayllm-{name}"
    victim = compat.running_replicas(app, name)[0][1]
    killed = threading.Event()

    def kill_when_busy() -> None:  # from outside, once the job has rows on every replica
        while sum(i["rows"] for i in _replicas(name).values()) < 100:
            pass
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
        killed.set()

    try:
        config = ProcessorConfig(
            deployment=name, task="completion", batch_size=4, max_in_flight_batches=8
        )
        rows = [{"id": i, "prompt": f"row {i} " + "w " * 20} for i in range(600)]
        killer = threading.Thread(target=kill_when_busy, daemon=True)
        killer.start()
        out = build_processor(config)(ray.data.from_items(rows)).take_all()
        killer.join(timeout=60)
    finally:
        relayllm.shutdown(name)
    assert killed.is_set()
    assert sorted(r["id"] for r in out) == list(range(600))
    assert [r for r in out if r["error"] is not None] == []
    assert all(r["generated_text"] == r["prompt"].strip() for r in out)


def test_http_requests_of_one_session_keep_their_replica():
    """X-Session-ID: Serve's proxy puts it in the request's session_id, the router's key."""
    import urllib.request

    from support import serve_proxy_on_http_port

    name = "aff-http"
    # Serve has one proxy, the session's: a shared deployment left running without one (the
    # session's echo) is shut down first, so Serve can be started with it.
    port = serve_proxy_on_http_port()
    relayllm.deploy(
        DeploymentConfig(
            name=name,
            backend="echo",
            num_replicas=3,
            routing="affinity",
            http={"route_prefix": "/aff-http", "port": port},
        )
    )
    try:
        url = relayllm.get_deployment(name).handle().info.remote().result(timeout_s=60)
        url = url["http"]["url"] + "/chat/completions"
        body = {"model": name, "messages": [{"role": "user", "content": "hello there"}]}
        for _ in range(12):
            request = urllib.request.Request(
                url,
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json", "X-Session-ID": "one-session"},
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                assert json.load(response)["choices"][0]["message"]["content"] == "hello there"
        served = sorted(i["http"]["rows"] for i in _replicas(name).values())
    finally:
        relayllm.shutdown(name)
    assert served == [0, 0, 12]
