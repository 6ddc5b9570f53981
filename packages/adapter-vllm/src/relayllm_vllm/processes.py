"""The engine's processes, read from the operating system (psutil, a dependency of vLLM): what
a replica started, which of them are vLLM's own, and whether one is stopped or gone -- read
without sending the engine a message, so a hung engine cannot hide it."""

from __future__ import annotations

import os
from typing import Any


def descendants(pid: int | None = None) -> list[Any]:
    """The children, grandchildren, ... of this process or ``pid`` (psutil.Process objects)."""
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def kill_all(processes: list[Any]) -> None:
    """SIGKILL each (psutil checks it is still the process recorded: no pid reuse) and wait
    for them to go. A stopped process cannot ignore SIGKILL."""
    import psutil

    for proc in processes:
        try:
            proc.kill()
        except psutil.Error:  # already gone
            pass
    psutil.wait_procs(processes, timeout=5)


def is_engine(proc: Any, parent: int | None = None) -> bool:
    """A process of vLLM's own, not a helper such as multiprocessing's resource tracker: one
    vLLM titled (``VLLM::EngineCore``, ``VLLM::Worker``; the title is in its name, the
    kernel's ``comm``, and its command line), or a child of ``parent`` (the replica) that
    multiprocessing spawned -- the engine core, which titles itself from inside and so may be
    seen untitled."""
    try:
        name, command = proc.name(), " ".join(proc.cmdline())
        spawned = "multiprocessing.spawn" in command and parent is not None
        return (
            name.startswith("VLLM::")
            or command.startswith("VLLM::")
            or (spawned and proc.ppid() == parent)
        )
    except Exception:  # gone already
        return False


def engine_processes(processes: list[Any]) -> list[Any]:
    """The processes to watch for a hang among those a replica started (:func:`is_engine`)."""
    parent = os.getpid()
    return [proc for proc in processes if is_engine(proc, parent)]


def stuck_process(processes: list[Any]) -> str | None:
    """Which of the engine's processes is stopped or gone, if any."""
    import psutil

    for proc in processes:
        try:
            status = proc.status()
            name = proc.name()
        except psutil.NoSuchProcess:
            return f"its process {proc.pid} is gone"
        except psutil.Error:  # cannot tell: not evidence of a hang
            continue
        if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE):
            return f"its process {proc.pid} ({name}) is {status}"
    return None


__all__ = ["descendants", "engine_processes", "is_engine", "kill_all", "stuck_process"]
