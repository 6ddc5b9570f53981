"""How a vLLM replica watches and stops its engine's processes, on real processes (no engine):
a stopped process is found by the health check's probe, and stopping the engine reaches a
grandchild that outlived its parent (what EngineCore's ``VLLM::Worker`` does when EngineCore is
killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from relayllm_vllm.memory import GIB, memory_shortfall
from relayllm_vllm.processes import descendants, engine_processes, kill_all, stuck_process

SLEEPER = "import time; time.sleep(600)"
#: A child that starts a grandchild, prints its pid and waits.
PARENT = (
    "import subprocess, sys, time; "
    f"p = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]); "
    "print(p.pid, flush=True); time.sleep(600)"
)


def test_a_stopped_or_vanished_process_is_reported_and_a_running_one_is_not():
    child = subprocess.Popen([sys.executable, "-c", SLEEPER])
    try:
        proc = psutil.Process(child.pid)
        assert stuck_process([proc]) is None
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while proc.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "is stopped" in (stuck_process([proc]) or ""), proc.status()
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait()
        assert "is gone" in (stuck_process([proc]) or "")
    finally:
        child.kill()
        child.wait()


def test_stopping_reaches_a_grandchild_whose_parent_died():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    grandchild = int(parent.stdout.readline())
    # What the replica records once its engine is ready (here: under the child, not this
    # process, whose descendants include the test's Ray cluster).
    recorded = [psutil.Process(parent.pid), *descendants(parent.pid)]
    assert grandchild in {p.pid for p in recorded}
    os.kill(grandchild, signal.SIGSTOP)  # a stopped process too: SIGKILL still ends it
    parent.kill()  # EngineCore killed: the grandchild is no longer under anything we own
    parent.wait()
    assert psutil.Process(grandchild).ppid() != parent.pid
    kill_all(recorded)
    assert not psutil.pid_exists(grandchild) or (
        psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
    )


#: What the titled child runs (setproctitle is a dependency of vLLM, which titles with it).
TITLED = "import setproctitle, time; setproctitle.setproctitle('VLLM::Worker'); time.sleep(600)"


def test_the_engine_core_is_watched_with_or_without_its_title():
    """EngineCore titles itself from inside (``VLLM::EngineCore``), so a replica may see it
    untitled: a child multiprocessing spawned is watched either way (else a hung engine would
    never be found and the job would wait for its calls' timeout); the resource tracker
    multiprocessing starts beside it is not, nor an unrelated grandchild."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    # Targets a spawned child can import (it does not import this test module).
    untitled = spawn.Process(target=time.sleep, args=(600,))
    titled = spawn.Process(target=exec, args=(TITLED,))
    helper = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    untitled.start()
    titled.start()
    try:
        grandchild = int(helper.stdout.readline())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if psutil.Process(titled.pid).name().startswith("VLLM::"):
                break
            time.sleep(0.05)
        found = {p.pid for p in descendants()}
        tracker = {
            p.pid
            for p in psutil.Process().children()
            if "resource_tracker" in " ".join(p.cmdline())
        }
        watched = {p.pid for p in engine_processes(descendants())}
        assert {untitled.pid, titled.pid, helper.pid, grandchild} <= found
        assert {untitled.pid, titled.pid} <= watched, watched
        assert not watched & ({helper.pid, grandchild} | tracker), watched
    finally:
        for proc in (untitled, titled):
            proc.kill()
            proc.join()
        helper.kill()
        helper.wait()


def test_memory_shortfall_names_what_was_asked_and_what_the_node_has():
    assert memory_shortfall(2 * GIB, GIB // 2, 4 * GIB) is None
    message = memory_shortfall(40 * GIB, GIB // 2, 16 * GIB)
    assert message.startswith("the vLLM engine needs about 40.5 GiB of memory")
    assert "KV cache 40.0 GiB + weights 0.5 GiB" in message
    assert "16.0 GiB available" in message and "kv_cache_memory_gb" in message
