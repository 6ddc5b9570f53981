"""The hosts tier's clients, run inside host0 (``python tests/hosts/clients.py DOOR ...``):
pytest's own namespace cannot reach the hosts' addresses, and Serve's HTTP proxy listens on
host0's loopback. Each writes what it saw to files pytest reads; real ``openai`` clients.

``http URL OUTCOMES STOP``: :data:`CLIENTS` threads send chat requests one after another
(``max_retries=0``: every failure is seen, not retried away) until the file STOP exists;
each outcome is a line of OUTCOMES: when it was sent and when it ended (``time.monotonic``,
one clock for every process of the machine) and its status (200, another status, or the
connection error's name).

``batch-api URL KEY LINES PROGRESS RESULT``: a batch of LINES chat lines submitted to the
Batch API; PROGRESS holds its request counts as last polled; at a final status RESULT holds
the batch and its output and error files' lines.

``download URL KEY BATCH RESULT``: the batch BATCH and its files' lines again, into RESULT.

``watch [DEPLOYMENT BUSY]``: a driver that, connected, prints ``ready`` and the live nodes
(address -> id); on ``pick`` from stdin, the ``info`` of a replica of DEPLOYMENT that is busy
(BUSY ``calls``: batch calls in flight; ``http``: it has answered HTTP requests), asked every
50 ms until one is; on ``cut``, watches the node table every 0.1 s and prints ``dead``, when
(``time.monotonic``) and the id of the first node that died. What the partition tests cut
by (tests/hosts/conftest.py, ``Network.watch``): connected before, it picks the victim and
sees its death at once, where a new driver takes seconds to connect.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

CLIENTS = 4


def http(url: str, outcomes: str, stop: str) -> None:
    import openai

    api = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
    lock = threading.Lock()
    out = open(outcomes, "a")  # noqa: SIM115 (open while the clients run)

    def loop(i: int) -> None:
        n = 0
        while not os.path.exists(stop):
            sent = time.monotonic()
            try:
                api.chat.completions.create(
                    model="front", messages=[{"role": "user", "content": f"client {i} {n}"}]
                )
                outcome: object = 200
            except openai.APIStatusError as exc:
                outcome = exc.status_code
            except openai.APIConnectionError as exc:
                outcome = type(exc).__name__
            with lock:
                out.write(json.dumps([sent, time.monotonic(), outcome]) + "\n")
                out.flush()
            n += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.close()


def _files(api, batch) -> dict:
    from batch_api import lines_of

    return {
        "batch": batch.model_dump(),
        "output": lines_of(api, batch.output_file_id),
        "errors": lines_of(api, batch.error_file_id),
    }


def _write(path: str, data: dict) -> None:
    Path(path + ".part").write_text(json.dumps(data))
    os.replace(path + ".part", path)  # whole or not there


def batch_api(url: str, key: str, lines: str, progress: str, result: str) -> None:
    from batch_api import TERMINAL, chat_lines, client, submit

    api = client(url, key)
    batch = submit(api, chat_lines(int(lines), model="spread"))
    while True:
        try:  # the gateway runs in host0 and should answer throughout: say when it does not
            batch = api.batches.retrieve(batch.id)
            error = None
        except Exception as exc:
            error = repr(exc)
        counts = batch.request_counts.model_dump() if batch.request_counts else None
        _write(progress, {"id": batch.id, "counts": counts, "error": error})
        if error is None and batch.status in TERMINAL:
            break
        time.sleep(0.2)
    _write(result, _files(api, batch))


def download(url: str, key: str, batch_id: str, result: str) -> None:
    from batch_api import client

    api = client(url, key)
    _write(result, _files(api, api.batches.retrieve(batch_id)))


BUSY = {"calls": lambda info: info["ongoing"] > 0, "http": lambda info: info["http"]["rows"] > 0}


def watch(deployment: str | None = None, busy: str = "calls") -> None:
    import ray

    import relayllm

    ray.init(namespace="relayllm", logging_level="ERROR")

    def alive() -> dict[str, str]:
        return {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}

    nodes = alive()
    print("ready", json.dumps({ip: node for node, ip in nodes.items()}), flush=True)
    command = sys.stdin.readline().strip()
    if command == "pick":
        assert deployment is not None
        control, test = relayllm.control(deployment), BUSY[busy]
        while True:
            found = [info for info in control.replicas().values() if test(info)]
            if found:
                break
            time.sleep(0.05)
        print("busy", json.dumps(found[0]), flush=True)
        command = sys.stdin.readline().strip()
    assert command == "cut", command
    while set(nodes) <= set(alive()):
        time.sleep(0.1)
    print("dead", time.monotonic(), *(set(nodes) - set(alive())), flush=True)


if __name__ == "__main__":
    door, *args = sys.argv[1:]
    {"http": http, "batch-api": batch_api, "download": download, "watch": watch}[door](*args)
