"""The engine's processes, read from the operating system (psutil, a dependency of vLLM): what
a replica started, which of them are vLLM's own, and whether one is stopped or gone -- read
without sending the engine a message, so a hung engine cannot hide it."""

from __future__ import annotations

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


def is_engine(proc: Any) -> bool:
    """A process vLLM titled as its own (``VLLM::EngineCore``, ``VLLM::Worker``), not a helper
    such as multiprocessing's resource tracker. The title is in its name (the kernel's
    ``comm``, read without the process's memory) and its command line."""
    try:
        return proc.name().startswith("VLLM::") or " ".join(proc.cmdline()[:1]).startswith("VLLM::")
    except Exception:  # gone already
        return False


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


__all__ = ["descendants", "is_engine", "kill_all", "stuck_process"]
