"""Where Ray's, Serve's and the engines' logs go: the one switch for the CLI and the Python API.

Quiet (the default): the console shows relayllm's own messages and results only. What Ray,
Ray Data and Serve log in this process (the token-authentication notice, dataset and Serve
start-up lines) and the errors Ray publishes to the driver (``(raylet) Task ... failed``) go
to a log file, and the output of Ray's workers and Serve replicas (vLLM's start-up logs among
them) stays in Ray's session logs instead of being forwarded here.
Verbose (``configure_logging(verbose=True)``, ``RELAYLLM_VERBOSE=1`` or the CLI's
``--verbose``): everything on the console, as Ray prints it.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from relayllm import env

#: The loggers that print to the console on their own (each has a handler of its own).
_RAY_LOGGERS = ("ray", "ray.data", "ray.serve")

_state: dict[str, object] = {}


def configure_logging(
    verbose: bool | None = None, log_file: str | os.PathLike[str] | None = None
) -> Path | None:
    """Choose quiet or verbose logs; returns the log file of the quiet mode (None if verbose).

    ``verbose`` None reads ``RELAYLLM_VERBOSE``. ``log_file`` defaults to a new file under
    ``RELAYLLM_LOG_DIR`` (else the user's cache dir, ``relayllm/logs``). Call it before the
    first deployment or dataset; relayllm calls it with the defaults when Ray starts if you
    have not. Ray's own per-process logs stay in its session directory
    (``<temp dir>/ray/session_latest/logs``).
    """
    if verbose is None:
        verbose = env.VERBOSE.get()
    _state["verbose"] = verbose
    if verbose:
        _state.pop("file", None)
        return None
    path = Path(log_file) if log_file else _default_log_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    _state["file"] = path
    quiet_ray_loggers()
    return path


def is_verbose() -> bool:
    if "verbose" not in _state:
        configure_logging()
    return bool(_state["verbose"])


def log_file() -> Path | None:
    """The quiet mode's log file (None when verbose)."""
    is_verbose()
    return _state.get("file")  # type: ignore[return-value]


def announce(
    how_to_show: str = "relayllm.configure_logging(verbose=True) or RELAYLLM_VERBOSE=1",
) -> str | None:
    """The line that says where the logs went (once per process; None when verbose or said)."""
    path = log_file()
    if path is None or _state.get("announced"):
        return None
    _state["announced"] = True
    return (
        f"relayllm: logs of Ray, Serve and the engines: {path} and Ray's session logs "
        f"({how_to_show} shows them here)"
    )


def quiet_ray_loggers() -> None:
    """Point the console handlers of Ray's loggers at the log file. Ray Data and Serve set
    their handlers up when imported or started, so this runs again after each of those."""
    path = _state.get("file")
    if path is None or _state.get("verbose"):
        return
    import ray.data  # noqa: F401  (sets up the 'ray.data' logger on import: before we move it)

    stream = _state.get("stream")
    if stream is None or getattr(stream, "name", None) != str(path):
        stream = _state["stream"] = open(str(path), "a", encoding="utf-8", buffering=1)  # noqa: SIM115
    for name in _RAY_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(
                handler, logging.FileHandler
            ):
                handler.setStream(stream)
    from relayllm import compat

    # The errors Ray publishes to the driver ("(raylet) Task ... failed") too, which Ray
    # prints on stdout whatever log_to_driver says: to the log file while quiet.
    compat.route_ray_error_lines(_quiet_stream)


def _quiet_stream() -> object | None:
    """The log file's stream while quiet; None when verbose (Ray prints as it does)."""
    return None if _state.get("verbose") else _state.get("stream")


def send_stderr_to_log() -> None:
    """For the CLI, in quiet mode: the process's stderr (file descriptor 2) goes to the log
    file and ``sys.stderr`` keeps the console. Ray's C++ core writes some lines (an error-level
    note about actor restarts on every run) straight to descriptor 2, past Python's logging;
    this is the only way to keep them off the console. Not done for the Python API: a
    library does not take over its host's stderr."""
    import sys

    path = log_file()
    if path is None or _state.get("stderr_moved"):
        return
    sys.stderr.flush()
    console = os.fdopen(
        os.dup(2),
        "w",
        buffering=1,
        encoding=sys.stderr.encoding or "utf-8",
        errors="backslashreplace",
    )
    target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(target, 2)
    os.close(target)
    sys.stderr = console
    _state["stderr_moved"] = True


def _default_log_file() -> Path:
    base = env.LOG_DIR.get()
    if base:
        directory = Path(base)
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        directory = Path(cache) / "relayllm" / "logs"
    return directory / f"relayllm-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


__all__ = ["configure_logging", "is_verbose", "log_file"]
