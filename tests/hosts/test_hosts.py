"""Ray across hosts with addresses of their own (tests/hosts/conftest.py): the cluster is
up on those addresses, then, in each front door (``relayllm run``, ``relayllm batch``, the
HTTP front, the Batch API), a worker host is partitioned mid-job for longer than Ray's node
timeout and restored. One cluster for the module; the tests run in order on it, each door's
test first starting the raylet again on a host a cut before left without a node."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import check_two_step_rows, two_step_echo_pipeline, wait_for


def test_each_node_runs_at_its_hosts_address(hosts):
    alive = sorted(n["ip"] for n in hosts.nodes() if n["alive"])
    assert alive == [h.address for h in hosts.hosts]


ROWS = 400
#: Rows written (of the job's output) when the worker host is cut off.
CUT_AT = ROWS // 5


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def run_job(hosts, tmp_path, rows: int = ROWS) -> subprocess.Popen:
    """``relayllm run`` in host0 (the driver beside the head), writing ``out.jsonl``."""
    relayllm = str(Path(sys.executable).with_name("relayllm"))
    spec = two_step_echo_pipeline(tmp_path, rows)
    return hosts.head.popen(
        [relayllm, "run", str(spec), "--output", str(tmp_path / "out.jsonl"), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def check_rows(out: Path, rows: int = ROWS) -> None:
    check_two_step_rows([json.loads(line) for line in out.read_text().splitlines()], rows)


@pytest.mark.timeout(400)
def test_a_slow_lossy_link_loses_no_row_and_no_node(hosts, tmp_path):
    """host2's link delays every packet 50 ms each way and loses 3 %: the job finishes whole
    and Ray keeps the node (the health checks tolerate this link). Before the partition test,
    which leaves host1's node dead."""
    slow = hosts.hosts[2]
    slow.slow(delay_ms=50, loss_pct=3)
    try:
        job = run_job(hosts, tmp_path, rows=100)
        output, _ = job.communicate(timeout=300)
        assert job.returncode == 0, output[-3000:]
        check_rows(tmp_path / "out.jsonl", rows=100)
        by_ip = {n["ip"]: n["alive"] for n in hosts.nodes()}
        assert by_ip[slow.address], "the slow host's node stayed alive"
    finally:
        slow.unslow()


@pytest.mark.timeout(600)
def test_a_worker_host_partitioned_past_the_node_timeout_loses_no_row(hosts, tmp_path):
    out = tmp_path / "out.jsonl"
    job = run_job(hosts, tmp_path)
    with hosts.watch() as watch:
        wait_for(lambda: lines(out) >= CUT_AT or job.poll() is not None, f"{CUT_AT} rows out")
        assert job.poll() is None, f"the job ended before the cut: {job.stdout.read()[-3000:]!r}"
        watch.cut(hosts.hosts[1])
    output, _ = job.communicate(timeout=400)
    assert job.returncode == 0, output[-3000:]
    check_rows(out)


# -- the other doors, each with both worker hosts back (hosts.rejoin) ---------------------------

#: Where Serve's HTTP proxy listens, on host0's loopback (the namespace is the run's own).
PORT = 8000
LINES = 800
#: Lines done (of the batch's) when a host is cut.
LINES_CUT = LINES // 5
#: Seconds of each echo call of the batch doors: the batch runs long enough (tens of
#: seconds) for the victim to be picked and cut before it ends.
CALL_S = 1.0
CLIENTS_PY = str(Path(__file__).with_name("clients.py"))


def deployments_file(tmp_path, name: str, delay_s: float, **fields) -> Path:
    """One echo deployment of two replicas, one per worker host (each has one ``engine``
    slot, the head none)."""
    extra = "".join(f"\n    {key}: {json.dumps(value)}" for key, value in fields.items())
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(
        f"""
deployments:
  - name: {name}
    backend: echo
    num_replicas: 2
    options: {{delay_s: {delay_s}}}
    ray_actor_options: {{num_cpus: 0.1, resources: {{engine: 1}}}}{extra}
"""
    )
    return spec


def jsonl_lines(path: Path) -> list[dict]:
    """The complete lines written so far (a line being written is left out)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def relayllm_in_host0(hosts, *args, **env) -> subprocess.CompletedProcess:
    relayllm = str(Path(sys.executable).with_name("relayllm"))
    done = hosts.head.run([relayllm, *map(str, args)], env=hosts.head.env(**env), timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


@pytest.mark.timeout(900)
def test_relayllm_batch_through_a_partition_every_custom_id_once(hosts, tmp_path):
    """``relayllm batch`` (the command in host0, starting its deployment from ``--config``)
    while the host of a replica with calls in flight is partitioned past the node timeout and
    restored: the calls it held are sent again to the other replica, and every ``custom_id``
    comes out once, with no error line. (Tried with the stage's retries off, ``max_retries=0``
    in stage/udf.py's call: 15 error lines, ActorDiedError, its node dead.)"""
    from batch_api import chat_lines, jsonl

    print(f"\nhosts back: {hosts.rejoin()}")
    (tmp_path / "in.jsonl").write_bytes(jsonl(chat_lines(LINES, model="spread")))
    out, err = tmp_path / "out.jsonl", tmp_path / "out.errors.jsonl"
    relayllm = str(Path(sys.executable).with_name("relayllm"))
    job = hosts.head.popen(
        [relayllm, "batch", str(tmp_path / "in.jsonl"), "--output", str(out), "--batch-size", "10"]
        + ["--config", str(deployments_file(tmp_path, "spread", CALL_S))],
        # Actor calls: the gRPC transport re-sends a failed call once by itself, which would
        # hide a stage without retries (tests/cluster/test_batch_node_lost.py).
        env=hosts.head.env(RELAYLLM_SERVE_TRANSPORT="actor"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with hosts.watch("spread") as watch:
            wait_for(
                lambda: len(jsonl_lines(out)) >= LINES_CUT or job.poll() is not None,
                f"{LINES_CUT} lines written",
                timeout_s=300,
            )
            assert job.poll() is None, f"the batch ended before the cut: {job.communicate()}"
            cut = watch.cut()
        stdout, stderr = job.communicate(timeout=400)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, stderr[-3000:]
    written, failed = jsonl_lines(out), jsonl_lines(err)
    ids = [line["custom_id"] for line in written + failed]
    assert sorted(ids) == sorted(f"r{i}" for i in range(LINES)), "every custom_id once"
    assert not failed, (len(failed), failed[:2])
    said = [line for line in stdout.splitlines() if line.startswith('{"request_counts"')]
    assert json.loads(said[-1])["request_counts"] == {
        "total": LINES,
        "completed": LINES,
        "failed": 0,
    }, stdout[-500:]
    for line in written:
        answer = line["response"]["body"]["choices"][0]["message"]["content"]
        assert answer == f"line {line['custom_id'][1:]} words", line
    print(
        f"{cut.host.name} cut at {LINES_CUT}/{LINES} lines, its replica in "
        f"{cut.replica['ongoing']} calls; its node seen dead {cut.seconds:.1f} s after the cut"
    )


def outcomes_in(path: Path) -> list[tuple[float, float, object]]:
    return [tuple(line) for line in jsonl_lines(path)]


#: What a client may get from a request the partition interrupted: what an OpenAI client
#: retries by itself (every 5xx status, a dropped connection or a timeout).
RETRYABLE = ("APIConnectionError", "APITimeoutError")


@pytest.mark.timeout(900)
def test_the_http_front_through_a_partition_answers_or_fails_retryably(hosts, tmp_path):
    """A deployment with an HTTP front (Serve's proxy in host0), one replica per worker host,
    4 ``openai`` clients in host0 sending requests one after another with no retries of their
    own; the host of a replica with calls in flight is partitioned past the node timeout and
    restored. Every request is answered or fails with a status the client retries, and the
    requests sent once the node is seen dead are answered (by the replica left) from then on.
    Counted: the requests failed, those in flight at the cut, and how long the longest request
    sent between the cut and the node seen dead took (the bound calls move off within)."""
    print(f"\nhosts back: {hosts.rejoin()}")
    spec = deployments_file(
        tmp_path,
        "front",
        0.2,
        http={"port": PORT},
        health_check_period_s=1,
        health_check_timeout_s=5,
    )
    relayllm_in_host0(hosts, "deploy", spec)
    outcomes, stop = tmp_path / "outcomes.jsonl", tmp_path / "stop"
    clients = hosts.head.popen(
        [sys.executable, CLIENTS_PY, "http", f"http://127.0.0.1:{PORT}/front/v1"]
        + [str(outcomes), str(stop)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        ok = lambda after=0.0: sum(  # noqa: E731
            1 for s, _, o in outcomes_in(outcomes) if s > after and o == 200
        )
        # HTTP requests are not batch calls (``ongoing``): a replica that has answered some,
        # of the two the 4 clients keep busy.
        with hosts.watch("front", "http") as watch:
            wait_for(lambda: ok() >= 20 or clients.poll() is not None, "requests answered")
            assert clients.poll() is None, clients.communicate()[0][-3000:]
            cut = watch.cut()
        wait_for(lambda: ok(cut.dead_at) >= 40, "requests answered after the node was seen dead")
        left = {hosts.host_at(r["node_ip"]).name for r in hosts.replicas("front")}
    finally:
        stop.touch()
        try:
            clients.wait(timeout=120)
        finally:
            if clients.poll() is None:
                clients.kill()
            relayllm_in_host0(hosts, "shutdown", "front")
    seen = outcomes_in(outcomes)
    failed = [(s, e, o) for s, e, o in seen if o != 200]
    assert all(o in RETRYABLE or (isinstance(o, int) and o >= 500) for *_, o in failed), failed
    in_flight = [o for s, e, o in seen if s <= cut.at <= e]
    last = [o for *_, o in sorted(seen)[-20:]]
    assert all(o == 200 for o in last), f"the last 20 requests answered: {last}"
    longest = max(e - s for s, e, _ in seen if cut.at <= s <= cut.dead_at or s <= cut.at <= e)
    print(
        f"{cut.host.name} cut (its replica had answered {cut.replica['http']['rows']}), its "
        f"node seen dead {cut.seconds:.1f} s after: {len(seen)} requests, {len(failed)} failed "
        f"({sorted({str(o) for *_, o in failed})}), {len(in_flight)} in flight at the cut; "
        f"the longest request around the cut {longest:.1f} s; replicas then on {sorted(left)}"
    )


KEY = "alpha-key-" + "a" * 24


@pytest.mark.timeout(900)
def test_the_batch_api_through_a_partition_every_custom_id_once(hosts, tmp_path):
    """``relayllm serve`` (its gateway and runner on the head, in host0) runs a batch an
    ``openai`` client in host0 submitted; at 20 % of its lines the host of a replica with
    calls in flight is partitioned past the node timeout and restored. The batch completes,
    every ``custom_id`` once, no error line; and once the host has a node again (its raylet
    started anew, the deployment's replica back on it), the batch's files are what they were:
    nothing the host computed meanwhile was written later.

    The runner calls on the default (gRPC) transport: with the stage's retries off and its
    fall-back re-send to actor calls off too, this still passed (1 call in flight on the cut
    replica, no error line), so what re-sends that call here is below the stage and not
    pinned down yet; a no-op partition (the link left up) fails it."""
    print(f"\nhosts back: {hosts.rejoin()}")
    spec = deployments_file(tmp_path, "spread", CALL_S)
    state = tmp_path / "state"
    relayllm_in_host0(
        hosts,
        "serve",
        spec,
        "--port",
        PORT,
        "--direct-port",
        "off",
        "--state-dir",
        state,
        "--batch-size",
        10,
        RELAYLLM_API_KEYS=f"alpha={KEY}",
    )
    url = f"http://127.0.0.1:{PORT}/v1"
    progress, result = tmp_path / "progress.json", tmp_path / "result.json"
    client = hosts.head.popen(
        [sys.executable, CLIENTS_PY, "batch-api", url, KEY, str(LINES)]
        + [str(progress), str(result)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def completed() -> int:
        try:
            return (json.loads(progress.read_text())["counts"] or {}).get("completed", 0)
        except (OSError, ValueError):
            return 0

    try:
        with hosts.watch("spread") as watch:
            wait_for(
                lambda: completed() >= LINES_CUT or client.poll() is not None,
                f"{LINES_CUT} lines completed",
                timeout_s=300,
            )
            assert client.poll() is None, client.communicate()[0][-3000:]
            cut = watch.cut()
        client.wait(timeout=400)
        assert client.returncode == 0, client.communicate()[0][-3000:]
        done = json.loads(result.read_text())
        assert done["batch"]["status"] == "completed", done["batch"]
        ids = [line["custom_id"] for line in done["output"]]
        assert sorted(ids) == sorted(f"r{i}" for i in range(LINES)), "every custom_id once"
        assert not done["errors"], (len(done["errors"]), done["errors"][:2])
        assert done["batch"]["request_counts"] == {
            "total": LINES,
            "completed": LINES,
            "failed": 0,
        }
        # The host comes back: a node again, and the deployment's replica on it.
        assert hosts.rejoin() == [cut.host.name]
        wait_for(
            lambda: (
                {r["node_ip"] for r in hosts.replicas("spread")}
                == {h.address for h in hosts.hosts[1:]}
            ),
            "a replica on each worker host again",
            timeout_s=180,
            period_s=1,
        )
        again = tmp_path / "again.json"
        fetched = hosts.head.run(
            [sys.executable, CLIENTS_PY, "download", url, KEY, done["batch"]["id"], str(again)],
            timeout=120,
        )
        assert fetched.returncode == 0, fetched.stderr[-3000:]
        assert json.loads(again.read_text()) == done, "the batch's files, unchanged"
    finally:
        if client.poll() is None:
            client.kill()
        relayllm_in_host0(hosts, "unserve")
        relayllm_in_host0(hosts, "shutdown")
    print(
        f"{cut.host.name} cut at {LINES_CUT}/{LINES} lines (its replica in "
        f"{cut.replica['ongoing']} calls), its node seen dead {cut.seconds:.1f} s after the cut"
    )
