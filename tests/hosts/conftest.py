"""The hosts tier's fixture: several hosts on this one machine, each a network namespace with
its own address, a Ray head in the first and a worker node in each of the others.

Unlike the cluster tier (nodes sharing loopback), a host here can be cut off its network, as a
machine is: every host has a veth whose other end sits on a bridge, and the bridge lives in a
namespace of its own. So every packet between nodes crosses a link a test can take down
(:meth:`Host.partition`), slow or make lossy (:meth:`Host.slow`, tc netem), and a run's
subnet never meets the machine's own network or another run's (each run's bridge namespace is
its own world). Parallel runs still take subnets of their own: Ray's `ray start` looks for a
running cluster at its address among every process of the machine, whatever its namespace.

The driver (``relayllm run``, a node watcher) runs inside host0's namespace, beside the head,
rather than in pytest's process: a Ray driver must sit on a node of the cluster (its address
one a raylet has), and giving the root namespace an address on the bridge would route the
machine's traffic into the test network. Partitions are of worker hosts only, so the driver
keeps its head. pytest talks to the hosts through files and ``ip netns exec``.

Names carry a prefix and pytest's pid (``rlh<pid>``): a previous run that crashed leaves
namespaces whose pid is dead, and the fixture removes them (their processes SIGKILLed first).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from support import NODE_HEALTH_CHECKS

PREFIX = "rlh"
#: This run's /24 (by pytest's pid: see the module's docstring).
SUBNET = f"10.213.{os.getpid() % 256}"
HEAD_PORT = 6379
#: The GCS store's Redis port, on the bridge's address.
REDIS_PORT = 6380
#: Each host's logical CPUs: the machine has two cores, the echo replicas ask for fractions.
HOST_CPUS = 1
#: Every node's `ray start` options besides its role.
NODE_OPTIONS = ["--num-cpus", str(HOST_CPUS), "--object-store-memory", str(80 * 1024 * 1024)]
ROOT = Path(__file__).resolve().parents[2]
CLIENTS_PY = str(Path(__file__).with_name("clients.py"))
PYTHONPATH = os.pathsep.join(
    str(ROOT / p) for p in ("packages/core/src", "packages/service/src", "tests")
)


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable() -> str | None:
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "the hosts tier needs iproute2's ip and tc: python .ci/iproute2.py installs it"
    if os.geteuid() != 0:
        return "the hosts tier needs root (network namespaces, veth, tc)"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(ns: str) -> int:
    """SIGKILL every process in namespace ``ns``; returns how many there were."""
    pids = [int(p) for p in ip("netns", "pids", ns, check=False).stdout.split()]
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    return len(pids)


def remove_leftovers() -> list[str]:
    """Namespaces of runs whose pytest is gone (crashed or killed): their processes killed,
    the namespaces deleted. A live run's namespaces are left alone."""
    removed = []
    for line in ip("netns", "list").stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if not ns.startswith(PREFIX):
            continue
        owner = ns[len(PREFIX) :].split("-")[0]
        if owner.isdigit() and not _pid_alive(int(owner)):
            _kill_namespace(ns)
            ip("netns", "delete", ns, check=False)
            removed.append(ns)
    return removed


class Host:
    """One host: a namespace with loopback and ``eth0`` (its address), the other end of
    ``eth0`` on the run's bridge."""

    def __init__(self, net: Network, index: int) -> None:
        self.net = net
        self.index = index
        self.name = f"host{index}"
        self.ns = f"{net.tag}-{self.name}"
        self.address = f"{SUBNET}.{10 + index}"
        #: The bridge's end of this host's cable (in the bridge's namespace).
        self.port = f"p{index}"

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": PYTHONPATH,
            "RAY_ADDRESS": self.net.head_address,
            "RAY_TMPDIR": str(self.net.temp),
            "RELAYLLM_ECHO_BACKEND": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            # Ray 2.60 clusters use token auth: the run's own token, never the user's file.
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.net.token,
            # A raylet waits this long for its agent's ports: on a loaded 2-core machine the
            # agent takes more than Ray's default to import.
            "RAY_agent_register_timeout_ms": "180000",
            # How long a node waits for a lost GCS to come back before it exits: a new head
            # takes more than Ray's 60 s to start on a loaded 2-core machine.
            "RAY_gcs_rpc_server_reconnect_timeout_s": "300",
            # How long Serve's controller waits for a new proxy to say it is ready before it
            # replaces it: a proxy's start on a loaded 2-core machine takes more than 15 s.
            "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "120",
            **extra,
        }

    def command(self, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *cmd]

    def run(self, cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
        """``cmd`` inside this host (its network only), to the end."""
        kwargs.setdefault("env", self.env())
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(cmd), **kwargs)

    def popen(self, cmd: list[str], **kwargs) -> subprocess.Popen:
        """``cmd`` inside this host, in the background."""
        kwargs.setdefault("env", self.env())
        return subprocess.Popen(self.command(cmd), **kwargs)

    def partition(self) -> None:
        """The cable pulled: the bridge's end of the link down (the host sees no carrier and
        keeps its own configuration, as a machine whose switch port died)."""
        ip("-n", self.net.bridge_ns, "link", "set", self.port, "down")

    def restore(self) -> None:
        ip("-n", self.net.bridge_ns, "link", "set", self.port, "up")

    def slow(self, delay_ms: int = 0, loss_pct: float = 0.0) -> None:
        """Every packet the host sends waits ``delay_ms`` and ``loss_pct`` % of them are lost
        (tc netem on its eth0; the bridge's end gets the same, so both directions suffer)."""
        spec = ["netem", "delay", f"{delay_ms}ms", "loss", f"{loss_pct}%"]
        for ns, dev in ((self.ns, "eth0"), (self.net.bridge_ns, self.port)):
            done = subprocess.run(
                ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *spec],
                capture_output=True,
                text=True,
            )
            if "kind is unknown" in done.stderr:
                # The kernel has no sch_netem (a container's kernel may not): say so.
                why = "tc netem: this kernel has no netem qdisc (modprobe sch_netem)"
                pytest.fail(why) if _in_ci() else pytest.skip(why)
            assert done.returncode == 0, done.stderr

    def unslow(self) -> None:
        for ns, dev in ((self.ns, "eth0"), (self.net.bridge_ns, self.port)):
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)

    def kill(self) -> int:
        """SIGKILL every process in the host at once (a machine losing power); returns how
        many there were."""
        return _kill_namespace(self.ns)


@dataclasses.dataclass
class Cut:
    """A partition: the host cut, the replica picked on it (its ``info`` then; None when the
    host was named), when the cut began and when its node was seen dead."""

    host: Host
    replica: dict | None
    at: float
    dead_at: float

    @property
    def seconds(self) -> float:
        return self.dead_at - self.at


class Watch:
    """A driver in host0 (``clients.py watch``), connected before the cut: it picks the host
    to cut (one whose replica is busy right then) and sees the node die. A context manager:
    the driver is stopped at the end of the block."""

    def __init__(self, net: Network, deployment: str | None, busy: str) -> None:
        self.net = net
        args = [] if deployment is None else [deployment, busy]
        self.process = net.head.popen(
            [sys.executable, CLIENTS_PY, "watch", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.nodes: dict[str, str] = json.loads(self._said("ready"))

    def _said(self, word: str) -> str:
        """The rest of the watcher's next line that starts with ``word`` (Ray's own lines
        skipped)."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(word + " "):
                return line[len(word) + 1 :].strip()
        raise AssertionError(f"the watcher ended before saying {word!r}: {self.process.wait()}")

    def _tell(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def cut(self, host: Host | None = None) -> Cut:
        """A worker host partitioned until Ray's GCS declares its node dead (the event, not a
        clock), then restored: ``host``, or the host of a replica that is busy right before
        the cut. Times are ``time.monotonic`` (one clock for the machine's processes)."""
        replica = None
        if host is None:
            self._tell("pick")
            replica = json.loads(self._said("busy"))
            host = self.net.host_at(replica["node_ip"])
        node = self.nodes[host.address]
        host.partition()
        at = time.monotonic()
        # Past 90 s the watcher is stopped: the test fails saying the node never died.
        limit = threading.Timer(90, self.process.kill)
        limit.start()
        try:
            self._tell("cut")
            seen, *dead = self._said("dead").split()
        finally:
            limit.cancel()
            host.restore()
        assert dead == [node], f"the node that died: {dead}, not {host.name}'s {node}"
        return Cut(host, replica, at, float(seen))

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


class Network:
    """The run's bridge (in its own namespace) and its hosts; with ``gcs_store``, a Redis
    server on the bridge that the head's GCS keeps the cluster's state in (Ray's GCS fault
    tolerance), so a new head started after the first one is lost finds the cluster."""

    def __init__(self, count: int, temp: Path, *, gcs_store: bool = False) -> None:
        self.tag = f"{PREFIX}{os.getpid()}"
        self.bridge_ns = f"{self.tag}-br"
        self.temp = temp
        self.token = secrets.token_hex(32)
        self.hosts = [Host(self, i) for i in range(count)]
        self.gcs_store = gcs_store
        self.redis_password = secrets.token_hex(16)

    @property
    def head(self) -> Host:
        return self.hosts[0]

    @property
    def head_address(self) -> str:
        return f"{self.head.address}:{HEAD_PORT}"

    @property
    def redis_address(self) -> str:
        """Where the GCS store listens: the bridge's own address, on no host, so it outlives
        any host's loss."""
        return f"{SUBNET}.2:{REDIS_PORT}"

    def start_redis(self) -> None:
        """Debian's ``redis-server`` in the bridge's namespace, nothing written to disk (the
        state lives as long as the run)."""
        ip("-n", self.bridge_ns, "addr", "add", f"{SUBNET}.2/24", "dev", "br0")
        log = open(self.temp / "redis.log", "w")  # noqa: SIM115 (open while it runs)
        subprocess.Popen(
            ["ip", "netns", "exec", self.bridge_ns, "redis-server", "--bind", f"{SUBNET}.2",
             "--port", str(REDIS_PORT), "--requirepass", self.redis_password, "--save", "",
             "--appendonly", "no"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while "Ready to accept connections" not in (self.temp / "redis.log").read_text():
            assert time.monotonic() < deadline, (self.temp / "redis.log").read_text()[-2000:]
            time.sleep(0.2)

    def build(self) -> None:
        ip("netns", "add", self.bridge_ns)
        ip("-n", self.bridge_ns, "link", "set", "lo", "up")
        ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        for host in self.hosts:
            ip("netns", "add", host.ns)
            ip("-n", host.ns, "link", "set", "lo", "up")
            # Both ends made in the host's namespace, then one moved to the bridge's.
            ip("-n", host.ns, "link", "add", "eth0", "type", "veth", "peer", "name", host.port)
            ip("-n", host.ns, "link", "set", host.port, "netns", self.bridge_ns)
            ip("-n", host.ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            ip("-n", host.ns, "link", "set", "eth0", "up")
            ip("-n", self.bridge_ns, "link", "set", host.port, "master", "br0")
            ip("-n", self.bridge_ns, "link", "set", host.port, "up")

    def destroy(self) -> None:
        for ns in [h.ns for h in self.hosts] + [self.bridge_ns]:
            _kill_namespace(ns)
            ip("netns", "delete", ns, check=False)

    def ray(self) -> str:
        """The ``ray`` executable beside this Python."""
        return str(Path(sys.executable).with_name("ray"))

    def start_ray(self) -> None:
        if self.gcs_store:
            self.start_redis()
        self.start_head()
        self.wait_nodes(1)  # a worker's `ray start` needs the head registered
        for host in self.hosts[1:]:
            self._start_worker(host)
        self.wait_nodes(len(self.hosts))

    def start_head(self) -> None:
        """``ray start --head`` in host0 (again, after :meth:`lose_head`: with a GCS store the
        new head loads the cluster's state from it and the worker nodes reconnect)."""
        head = self.head
        store = []
        env = head.env()
        if self.gcs_store:
            env["RAY_REDIS_ADDRESS"] = self.redis_address
            # The key of this cluster's state in the store: the same for every head of it.
            env["RAY_external_storage_namespace"] = self.tag
            store = ["--redis-password", self.redis_password]
        started = head.run(
            [
                self.ray(),
                "start",
                "--head",
                "--node-ip-address",
                head.address,
                "--port",
                str(HEAD_PORT),
                "--include-dashboard=false",
                "--disable-usage-stats",
                "--temp-dir",
                str(self.temp / "head"),
                "--resources",
                json.dumps({"host0": 100}),
                # A partitioned node is declared dead in seconds (as in the cluster tier).
                "--system-config",
                json.dumps(NODE_HEALTH_CHECKS),
                *store,
                *NODE_OPTIONS,
            ],
            env=env,
        )
        self._started(started)

    def lose_head(self) -> int:
        """Every process of host0 SIGKILLed (the GCS, the head's raylet, Serve's controller and
        whatever else ran there); returns how many there were. The address file `ray start`
        left goes too, as with the machine: a new head finds none (Ray reads it, with every
        GCS process of this machine, whatever its namespace, to refuse a second head)."""
        killed = self.head.kill()
        (self.temp / "head" / "ray_current_cluster").unlink(missing_ok=True)
        return killed

    def _start_worker(self, host: Host) -> None:
        started = host.run(
            [
                self.ray(),
                "start",
                "--address",
                self.head_address,
                "--node-ip-address",
                host.address,
                "--disable-usage-stats",
                "--resources",
                json.dumps({host.name: 100, "engine": 1}),
                *NODE_OPTIONS,
            ]
        )
        self._started(started)

    @staticmethod
    def _started(started: subprocess.CompletedProcess) -> None:
        """``ray start`` gives a raylet 30 s (fixed in Ray) to register, less than it takes on
        a loaded 2-core machine; its processes keep starting, and :meth:`wait_nodes` is the
        check that they did."""
        late = "timed out during startup" in started.stderr
        assert started.returncode == 0 or late, started.stdout + started.stderr[-3000:]

    def _nodes(self) -> subprocess.CompletedProcess:
        script = (
            "import json, ray; ray.init(logging_level='ERROR');"
            "print(json.dumps([{'id': n['NodeID'], 'ip': n['NodeManagerAddress'],"
            " 'alive': n['Alive']} for n in ray.nodes()]))"
        )
        return self.head.run([sys.executable, "-c", script], timeout=120)

    def nodes(self) -> list[dict]:
        """Ray's node table as the head sees it (a short driver in host0)."""
        out = self._nodes()
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    def node_of(self, host: Host) -> str | None:
        """The id of the live node at ``host``'s address (None: none alive there)."""
        return next((n["id"] for n in self.nodes() if n["ip"] == host.address and n["alive"]), None)

    def host_at(self, address: str) -> Host:
        return next(h for h in self.hosts if h.address == address)

    def watch(self, deployment: str | None = None, busy: str = "calls") -> Watch:
        """A watcher connected now (``clients.py watch``) that picks the victim (a worker
        host whose replica of ``deployment`` is ``busy``) and sees its node die: what
        :meth:`Watch.cut` cuts by."""
        return Watch(self, deployment, busy)

    def rejoin(self) -> list[str]:
        """Every worker host without a live node (one partitioned past the node timeout: its
        raylet, told it is dead, exits when the link returns) starts one again, as an
        operator restarts a machine's raylet: whatever is left in the host killed, then
        ``ray start`` with the same resources. Returns the hosts' names."""
        back = []
        for host in self.hosts[1:]:
            if self.node_of(host) is None:
                host.kill()
                self._start_worker(host)
                back.append(host.name)
        if back:
            self.wait_nodes(len(self.hosts), timeout_s=180)
        return back

    def replicas(self, deployment: str) -> list[dict]:
        """Each running replica of the relayllm deployment ``deployment``: its own ``info``
        (its node's address, its calls in flight, the rows it answered), asked on it by a
        driver in host0."""
        script = (
            "import json, ray, relayllm;"
            "ray.init(namespace='relayllm', logging_level='ERROR');"
            f"print(json.dumps(list(relayllm.control({deployment!r}).replicas().values())))"
        )
        out = self.head.run([sys.executable, "-c", script], timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    def wait_nodes(self, count: int, timeout_s: float = 300) -> None:
        """Until ``count`` nodes are alive; a head still starting (a driver cannot join it
        yet) is waited for, and named with the driver's last error if it never comes."""
        deadline = time.monotonic() + timeout_s
        while True:
            out = self._nodes()
            if out.returncode == 0:
                alive = [n for n in json.loads(out.stdout.strip().splitlines()[-1]) if n["alive"]]
                if len(alive) >= count:
                    return
                why = f"alive: {alive}"
            else:
                why = out.stderr[-2000:]
            assert time.monotonic() < deadline, f"never happened: {count} nodes alive; {why}"
            time.sleep(1)


HOSTS = 3


def _network(*, gcs_store: bool = False):
    why = _unavailable() or (
        "the head-loss tests need Debian's redis-server: python .ci/redis.py installs it"
        if gcs_store and shutil.which("redis-server") is None
        else None
    )
    if why:
        if _in_ci():
            pytest.fail(why)
        pytest.skip(why)
    remove_leftovers()
    # Short: Ray's socket paths live under it (pytest's tmp_path is too long for them).
    net = Network(HOSTS, Path(tempfile.mkdtemp(prefix=PREFIX)), gcs_store=gcs_store)
    try:
        net.build()
        net.start_ray()
        yield net
    finally:
        net.destroy()
        shutil.rmtree(net.temp, ignore_errors=True)


@pytest.fixture(scope="module")
def hosts():
    """A head in host0 and worker nodes in host1 and host2, each host with its own address on
    the run's bridge; torn down (every process in each namespace SIGKILLed, the namespaces
    deleted) after the module."""
    yield from _network()


@pytest.fixture(scope="module")
def hosts_with_gcs_store():
    """:func:`hosts` whose head keeps the cluster's state in a Redis server on the bridge
    (Ray's GCS fault tolerance): the head can be lost and a new one started."""
    yield from _network(gcs_store=True)
