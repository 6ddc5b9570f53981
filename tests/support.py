"""Helpers every test suite shares: the repository's root, free ports, the ``relayllm`` command
in a subprocess, and the process table (Linux ``/proc``).

Importable as ``support`` from any test (pytest.ini puts ``tests/`` on the path). One copy of
each, so a fix (a port race, a process title, a stat field) reaches every suite at once.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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
    """The children of ``parent`` whose command line holds one of ``titles``."""
    found = set()
    for pid, cmdline in processes():
        if not any(title in cmdline for title in titles):
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
