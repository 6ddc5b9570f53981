"""Helpers every test suite shares: the repository's root, free ports, the ``relayllm`` command
in a subprocess, the process table (Linux ``/proc``), and the one way each kind of Ray cluster
and the echo deployment are started for a test.

Importable as ``support`` from any test (pytest.ini puts ``tests/`` on the path). One copy of
each, so a fix (a port race, a process title, a stat field, a slow cluster start) reaches every
suite at once. The cluster and deployment starters are context managers here rather than
fixtures in a conftest: each tier's fixtures wrap them at the scope they need (a session, a
module, a class), and the job scripts that run a cluster in a process of their own call them
too, which no fixture can serve.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: The repository's root: docs, examples and benchmarks are read from here.
REPO = Path(__file__).resolve().parents[1]

#: The ``relayllm`` console script of the environment running the tests.
RELAYLLM = str(Path(sys.executable).parent / "relayllm")

#: A command that takes longer has hung: it fails with its output instead of stopping the run.
CLI_TIMEOUT = 600


def free_port() -> int:
    """A TCP port nothing listens on right now (the kernel's pick, on loopback)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- Ray clusters and the echo deployment -------------------------------------------------------

#: The GCS's health checks of each node's raylet, for a cluster whose tests lose nodes
#: (``ray_cluster(system_config=...)``): Ray's defaults wait five missed checks three seconds
#: apart before a lost node is dead; three missed checks a second apart is seconds sooner and
#: still more than a raylet on a busy two-core machine is late.
NODE_HEALTH_CHECKS: dict[str, Any] = {
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1500,
    "health_check_failure_threshold": 3,
}


@contextlib.contextmanager
def ray_cluster(
    num_cpus: float = 2,
    *,
    resources: dict[str, float] | None = None,
    nodes: bool = False,
    namespace: str | None = None,
    log_to_driver: bool = False,
    runtime_env: dict[str, Any] | None = None,
    own_session: bool = False,
    attempts: int = 3,
    system_config: dict[str, Any] | None = None,
) -> Iterator[Any]:
    """A Ray cluster of the test's own with this process as its driver (2 CPUs by default,
    like the machine; no dashboard); Serve and Ray are shut down when the block ends. (One
    outside this process, started as a user starts one: :func:`ray_head_node`.)

    Without ``nodes``: ``ray.init(address="local")``, which always starts a new cluster (a
    ``RAY_ADDRESS`` tox passes through, or a cluster another run left on the machine, is never
    joined). A session this process already has is used as it is, unless ``own_session``: then
    it is shut down first (a module that reads its own session's logs). Yields None.

    With ``nodes``: the head of a ``ray.cluster_utils.Cluster``, yielded, so worker nodes join
    with ``cluster.add_node`` and are lost with ``cluster.remove_node``. Ray's temp dir is a
    private one (``RAY_TMPDIR`` while the block runs): Cluster writes its address where any
    ``ray.init()`` without an address on the machine would find it. ``system_config``: Ray's
    settings for the head's GCS (``_system_config``), such as how often it checks the nodes.

    ``resources``: the head's custom resources. ``attempts``: Ray gives a new raylet 30 s to
    register and a loaded machine misses that at times; a start (the local cluster, or the head)
    that timed out is tried again, ``attempts`` starts in all."""
    import ray
    from ray import serve

    cluster, connected, temp, temp_before = None, False, None, os.environ.get("RAY_TMPDIR")
    options = {"log_to_driver": log_to_driver, "namespace": namespace, "runtime_env": runtime_env}
    try:
        if nodes:
            from ray.cluster_utils import Cluster

            temp = tempfile.mkdtemp(prefix="rc")  # short: Ray's socket paths live under it
            os.environ["RAY_TMPDIR"] = temp
            head = {
                "num_cpus": num_cpus,
                "resources": resources or {},
                "include_dashboard": False,
                "_system_config": system_config or {},
            }
            cluster = _started(attempts, lambda: Cluster(initialize_head=True, head_node_args=head))
            ray.init(address=cluster.address, **options)
        else:
            if own_session and ray.is_initialized():
                serve.shutdown()
                ray.shutdown()
            if not ray.is_initialized():
                local = {"num_cpus": num_cpus, "resources": resources, "include_dashboard": False}
                _started(attempts, lambda: ray.init(address="local", **local, **options))
        connected = True
        yield cluster
    finally:
        try:
            if connected:
                serve.shutdown()
        finally:
            ray.shutdown()
            if cluster is not None:
                cluster.shutdown()
            if temp is not None:
                os.environ.pop("RAY_TMPDIR")
                if temp_before is not None:
                    os.environ["RAY_TMPDIR"] = temp_before
                shutil.rmtree(temp, ignore_errors=True)


def _started(attempts: int, start: Callable[[], Any]) -> Any:
    """``start()``, tried again (``attempts`` in all) while Ray says its node timed out."""
    import ray

    for attempt in range(1, attempts + 1):
        try:
            return start()
        except Exception as exc:
            if attempt == attempts or "timed out during startup" not in str(exc):
                raise
            ray.shutdown()


#: The echo deployment (echo's defaults) that modules share: a module whose ``ECHO`` is this
#: dict reuses the one running (``relayllm.deploy`` finds it by name and config) and leaves it
#: running for the next (``echo`` in tests/conftest.py); it starts again after a module that
#: shut everything down.
SHARED_ECHO = {"name": "session-echo"}

#: Serve's one HTTP proxy for the session: the modules that talk to an HTTP front put their
#: deployments' ``http.port`` here, so the proxy starts once and stays for the next module,
#: instead of Serve being restarted with a proxy on each module's own port.
HTTP_PORT = free_port()


def serve_proxy_on_http_port() -> int:
    """:data:`HTTP_PORT`, where Serve's proxy listens or will. When Serve runs without a proxy
    or with one on another port, every deployment is shut down and Serve stopped, so the next
    deployment with an ``http`` section starts Serve with its proxy on this port (Serve fixes
    its proxy when it starts); the modules sharing :data:`SHARED_ECHO` start it again when they
    next need it."""
    from ray import serve

    import relayllm
    from relayllm import compat

    try:
        running, _, port = compat.serve_proxy()
    except Exception:  # Serve is not running: the next deployment starts it
        return HTTP_PORT
    if not (running and port == HTTP_PORT):
        relayllm.shutdown()
        serve.shutdown()
    return HTTP_PORT


@contextlib.contextmanager
def echo_deployment(name: str, **fields: Any) -> Iterator[Any]:
    """The echo backend (a real Serve deployment) deployed as ``name`` on the connected
    cluster, with any other ``DeploymentConfig`` fields; shut down when the block ends. Yields
    its ``DeploymentRef``."""
    import relayllm

    ref = relayllm.deploy(relayllm.DeploymentConfig(name=name, backend="echo", **fields))
    try:
        yield ref
    finally:
        relayllm.shutdown(name)


@contextlib.contextmanager
def ray_head_node(
    prefix: str, *, kill: bool = False
) -> Iterator[tuple[subprocess.Popen[bytes], Path, dict[str, str]]]:
    """A cluster of the test's own, as a user starts one: ``ray start --head --block`` in a
    private temp dir (no other ``ray.init()`` on the machine finds it) and its own process
    group. Yields, once it runs (or its last try exited: :func:`wait_started` says why), (the
    process, its log, the environment of a driver: RAY_ADDRESS and the echo backend). Stopped
    at the end of the block; ``kill=True`` SIGKILLs the whole group, as a lost machine would,
    with no graceful stop."""
    bin_dir = Path(sys.executable).parent
    temp = tempfile.mkdtemp(prefix=prefix)  # short: Ray's socket paths live under it
    # Ray 2.60 clusters use token auth; drivers that pass an address must opt in to send it.
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RELAYLLM_ECHO_BACKEND": "1"}
    subprocess.run(
        [str(bin_dir / "ray"), "get-auth-token", "--generate"],
        env=env,
        capture_output=True,
        timeout=120,
    )  # writes Ray's token file only if there is none yet
    log_path = Path(temp, "head.log")
    # The ports are free when picked, not when Ray binds them (another test's process may
    # take one meanwhile): a head that exits before it starts is started again on new ones.
    for attempt in range(1, 4):
        port = free_port()
        log = open(log_path, "w")  # noqa: SIM115 (the head's log, open while it runs)
        head = subprocess.Popen(
            [
                str(bin_dir / "ray"),
                "start",
                "--head",
                "--block",
                f"--port={port}",
                "--node-ip-address=127.0.0.1",
                "--num-cpus=2",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--temp-dir={temp}",
                f"--ray-client-server-port={free_port()}",
                f"--dashboard-agent-listen-port={free_port()}",
                f"--dashboard-agent-grpc-port={free_port()}",
                f"--runtime-env-agent-port={free_port()}",
                f"--metrics-export-port={free_port()}",
            ],
            # On SIGTERM Ray drains the node first, up to 30 s, for traffic to move elsewhere:
            # a test's cluster has nowhere to move it, so it stops at once.
            env={**env, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if _head_started(head, log_path) or attempt == 3:
            break
        log.close()
        kill_group(head)
    try:
        yield head, log_path, {**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}
    finally:
        if not kill:
            head.send_signal(signal.SIGTERM)  # `ray start --block` stops its own processes
        try:
            head.wait(timeout=0 if kill else 10)
        except subprocess.TimeoutExpired:  # a process that would not stop: the group
            kill_group(head)  # holds only this cluster's processes
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def run_cluster_job(script: Path, *, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a script that starts a multi-node cluster of its own (``ray.cluster_utils.Cluster``)
    in a private Ray temp dir: Cluster writes its address where any ``ray.init()`` without an
    address on the machine would find it (another suite running beside this one, a command
    that should start a cluster of its own)."""
    temp = tempfile.mkdtemp(prefix="rt")  # short: Ray's socket paths live under it
    try:
        return subprocess.run(
            [sys.executable, str(script)],
            env={**os.environ, "RAY_TMPDIR": temp},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def job_result(stdout: str) -> dict:
    """The JSON object a job script printed last: the nodes a script starts share its stdout,
    so a raylet's log line may come after the script's own output."""
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith("{")), None)
    assert line is not None, f"the job printed no result:\n{stdout[-3000:]}"
    return json.loads(line)


def two_step_echo_pipeline(tmp_path: Path, rows: int) -> Path:
    """A pipeline file (and its ``rows`` input rows) of two echo steps on one replica per
    worker node (each worker node has one ``engine`` slot, the head none), the steps calling
    the replicas as actors with retries: the job the node-loss and partition tests run
    (``relayllm run``). Check its output with :func:`check_two_step_rows`.

    The actor transport: the default gRPC transport, on a failure, falls back to actor calls
    and re-sends the call once by itself, which would let a stage without retries pass
    (tried: 0 error rows with the stage's retries off; 40 error rows with them off and this
    transport)."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": i, "q": f"row {i}"}) + "\n" for i in range(rows)))
    step = """
    deployment: spread
    batch_size: 20
    max_retries: 8
    timeout_s: 30
    transport: actor"""
    spec = tmp_path / "pipeline.yaml"
    spec.write_text(
        f"""
deployments:
  - name: spread
    backend: echo
    num_replicas: 2
    options: {{delay_s: 0.05}}
    ray_actor_options: {{num_cpus: 0.1, resources: {{engine: 1}}}}
input:
  path: {data}
  id_column: id
steps:
  - name: answer
    prompt: "{{q}}"
    output_column: answer{step}
  - name: again
    prompt: "again {{answer}}"
    output_column: again{step}
"""
    )
    return spec


def check_two_step_rows(rows: list[dict], count: int) -> None:
    """The output of :func:`two_step_echo_pipeline`'s job on ``count`` rows: every row exactly
    once, no error row, both steps' answers."""
    ids = [r["id"] for r in rows]
    assert len(ids) == count and set(ids) == set(range(count)), "every row exactly once"
    failed = [r["error"] for r in rows if r.get("error")]
    assert not failed, (len(failed), sorted(set(failed))[:3])
    assert all(r["again"] == f"again row {r['id']}" for r in rows), "both steps answered"


def wait_for(condition, what: str, timeout_s: float = 120, period_s: float = 0.2) -> None:
    """Until ``condition()`` is true; past ``timeout_s`` the test fails saying ``what`` never
    happened."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(period_s)


def altered_wheel(original: Path, target: Path, edits: dict[str, tuple[str, str]]) -> Path:
    """A copy of a wheel's Python sources with ``edits`` (path -> (old, new)) applied: what an
    API contract test runs against to show it fails on a renamed or removed name."""
    with zipfile.ZipFile(original) as src, zipfile.ZipFile(target, "w") as dst:
        for item in src.infolist():
            if not item.filename.endswith(".py"):
                continue
            data = src.read(item).decode("utf-8")
            if item.filename in edits:
                old, new = edits[item.filename]
                assert old in data, f"{old!r} not in {item.filename}"
                data = data.replace(old, new)
            dst.writestr(item.filename, data)
    return target


def kill_group(head: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process of a :func:`ray_head_node` cluster: its process group and every
    process under the head (Ray starts each worker in a process group of its own)."""
    kill_tree(head.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.pid, signal.SIGKILL)
    head.wait(timeout=60)


def descendants(root: int) -> list[set[int]]:
    """The processes under ``root`` by depth, from /proc: its children, their children, ..."""
    parents: dict[int, int] = {}
    for pid, _ in processes():
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[pid] = parent_pid(pid)
    levels, frontier, found = [], {root}, {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
        if frontier:
            levels.append(frontier)
    return levels


def kill_tree(root: int) -> set[int]:
    """SIGKILL ``root`` and every process under it, the deepest first; returns their pids.

    Children before parents: a worker whose parent dies first is left in an orphaned process
    group, and the kernel then sends it SIGHUP and SIGCONT. A worker a test had stopped
    (SIGSTOP) would so run again for a moment, and could write after the test read its files,
    before the SIGKILL meant for it arrived."""
    levels = descendants(root)
    killed = {root}
    for level in [*reversed(levels), {root}]:
        for pid in level:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= level
    return killed


def _head_started(head: subprocess.Popen[bytes], log: Path, timeout_s: float = 300) -> bool:
    """Whether ``ray start`` said the cluster runs before it exited (False) or the timeout."""
    deadline = time.monotonic() + timeout_s
    while "Ray runtime started" not in log.read_text():
        if head.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def wait_started(head: subprocess.Popen[bytes], log: Path, timeout_s: float = 300) -> None:
    """Until ``ray start`` says the cluster runs (its exit or the timeout fails the test)."""
    deadline = time.monotonic() + timeout_s
    while "Ray runtime started" not in log.read_text():
        assert head.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"ray start did not come up in {timeout_s:.0f} s"
        time.sleep(0.5)


def cli(
    *args: object,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    check: int | None = None,
    timeout: float = CLI_TIMEOUT,
) -> subprocess.CompletedProcess[str]:
    """``relayllm *args`` in a subprocess, its output captured. ``env`` defaults to this
    process's environment with the echo backend on; ``check`` is the exit code to assert."""
    done = subprocess.run(
        [RELAYLLM, *map(str, args)],
        env=env or {**os.environ, "RELAYLLM_ECHO_BACKEND": "1"},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check is not None:
        assert done.returncode == check, (
            f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        )
    return done


def session_logs_holding(ray, *secrets: str) -> tuple[int, list[tuple[str, str]]]:
    """Every log file of the connected Ray session (drivers, workers, Serve's replicas and
    proxy, the raylet...) read whole: (files read, [(file, the secret's first 5 characters)]
    for each file holding a secret). A test of secrets: the list must be empty."""
    logs = Path(ray._private.worker.global_worker.node.get_session_dir_path()) / "logs"
    read, hits = 0, []
    for path in logs.rglob("*"):
        if path.is_file():
            read += 1
            data = path.read_bytes()
            hits += [(path.name, s[:5]) for s in secrets if s.encode() in data]
    return read, hits


# -- the process table -------------------------------------------------------------------------


def _stat_fields(pid: int | str) -> list[str]:
    """``/proc/PID/stat`` after the command name (which may hold spaces and parentheses):
    field 0 is the state, field 1 the parent's pid."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def parent_pid(pid: int | str) -> int:
    return int(_stat_fields(pid)[1])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not reaped, does not)."""
    try:
        return _stat_fields(pid)[0] != "Z"
    except OSError:
        return False


def stop_process(pid: int, timeout_s: float = 60) -> None:
    """SIGSTOP ``pid`` and wait until every thread of it has stopped. A thread in the middle
    of a system call (a write to a busy disk, say) stops only when the call returns: what it
    was writing lands after the signal, and a file read before that misses it."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while True:
        running = {}
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                state = _stat_fields(f"{pid}/task/{task}")[0]
                if state not in "Tt":
                    running[task] = state
        if not running:
            return
        assert time.monotonic() < deadline, f"pid {pid}: threads not stopped: {running}"
        time.sleep(0.01)


def _comm(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/comm").read_bytes()
    except OSError:
        return b""


def describe(pids: list[int]) -> list[str]:
    """Each process's pid, parent, state, name and command line as /proc shows them now."""
    shown = []
    for pid in pids:
        try:
            state, parent = _stat_fields(pid)[:2]
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0")[:80]
            shown.append(f"{pid} (parent {parent}, {state}, {_comm(pid).strip()!r}, {cmdline!r})")
        except (OSError, ValueError):
            shown.append(f"{pid} (gone)")
    return shown


def processes() -> Iterator[tuple[int, bytes]]:
    """(pid, command line) of every process readable now."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            yield int(proc.name), (proc / "cmdline").read_bytes()
        except OSError:
            continue


def children(parent: int, *titles: bytes) -> set[int]:
    """The children of ``parent`` whose command line or name holds one of ``titles`` (or its
    first 15 bytes: the kernel's ``comm``, which a title also sets and which is read without
    the process's memory, where ``cmdline`` lives)."""
    found = set()
    for pid, cmdline in processes():
        if not any(title in cmdline for title in titles):
            name = _comm(pid)
            if not any(title[:15] in name for title in titles):
                continue
        try:
            if parent_pid(pid) == parent:
                found.add(pid)
        except (OSError, ValueError, IndexError):
            continue
    return found


def peak_rss_mib(pid: int) -> float:
    """Peak resident set size of a process (``VmHWM``; 0 for a process already exiting)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- how a Ray actor ended ---------------------------------------------------------------------


def actor_death_reason(pid: int) -> str:
    """Why the actor whose process was ``pid`` died, as Ray's GCS recorded it: ``WORKER_DIED``
    when its process ended by itself (or by a signal), ``RAY_KILL`` when Ray killed it (as Serve
    kills a replica after failed health checks). The GCS is asked directly: the state API needs
    the dashboard, which the test clusters do not start."""
    from ray._private import state

    for actor in state.actors().values():
        if actor.get("Pid") == pid and actor.get("State") == "DEAD":
            context = actor["DeathCause"].actor_died_error_context
            reason = context.DESCRIPTOR.fields_by_name["reason"].enum_type
            return reason.values_by_number[context.reason].name
    raise AssertionError(f"no dead actor had pid {pid}")
