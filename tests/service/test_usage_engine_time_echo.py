"""Engine time in the usage ledger, end to end: ``relayllm serve`` on an echo deployment that
sleeps per call (its engine time), the real ``openai`` client on loopback. A batch's lines
each carry ``engine_s`` (their call's share of the replica's busy time, split by tokens); the
ledger's engine time for the batch is above zero, equals the sum over its output file and
equals what the replica's engine counted while the batch ran (the deployment serves nothing
else meanwhile); the Usage API and ``relayllm usage --json`` answer the same. An online answer
carries its engine time and the ledger records it."""

import json
import os
import time

import pytest
from batch_api import (
    ADMIN_KEY,
    PROJECT_KEYS,
    chat_lines,
    client,
    lines_of,
    serve_echo,
    submit,
    wait,
)
from support import cli

pytestmark = pytest.mark.usefixtures("ray_session")

openai = pytest.importorskip("openai")

DEPLOYMENTS = """\
deployments:
  - name: timed
    backend: echo
    options:
      delay_s: 0.05
"""


@pytest.fixture(scope="module")
def service(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("engine-time")
    began = int(time.time())
    url, address, _ = serve_echo(ray_session, root, DEPLOYMENTS, "--batch-size", 2)
    yield {"url": url, "address": address, "began": began, "state": str(root / "state")}
    cli("unserve", "--address", address, check=0)


def busy_s():
    """The deployment's engine busy seconds, summed over its replicas (as ``relayllm run``'s
    summary reads them)."""
    from relayllm.deployments import control

    infos = control("timed").replicas(timeout_s=30)
    return sum(info["metrics"]["engine_busy_s"] for info in infos.values())


def online_rows(service):
    """The ledger's rows of online requests, read from its file."""
    from relayllm_service.settings import ServiceSettings
    from relayllm_service.tenancy.usage import UsageLedger

    ledger = UsageLedger(ServiceSettings(state_dir=service["state"]).store_path)
    try:
        return [dict(row) for row in ledger.rows(0, 1 << 40, batch=False)]
    finally:
        ledger.close()


def test_the_ledgers_engine_time_for_a_batch_is_what_the_replica_counted_for_it(service):
    from relayllm_service.settings import ServiceSettings
    from relayllm_service.tenancy.usage import UsageLedger

    alpha = client(service["url"], PROJECT_KEYS["alpha"])
    before = busy_s()
    batch = wait(alpha, submit(alpha, chat_lines(12, model="timed")).id, timeout=120)
    assert batch.status == "completed", batch
    counted = busy_s() - before
    output = lines_of(alpha, batch.output_file_id)
    per_line = [line["response"]["body"]["engine_s"] for line in output]
    assert len(per_line) == 12 and all(seconds > 0 for seconds in per_line)
    ledger = UsageLedger(ServiceSettings(state_dir=service["state"]).store_path)
    try:
        (charged,) = ledger.batch_totals(batch.id).values()
    finally:
        ledger.close()
    assert charged.engine_s == pytest.approx(sum(per_line), abs=1e-6)
    assert counted >= 0.05  # six calls of two lines, each sleeping 0.05 s, some at once
    assert charged.engine_s == pytest.approx(counted, abs=0.002)  # engine_busy_s: ms

    message = [{"role": "user", "content": "how long did this take"}]
    answer = alpha.chat.completions.create(model="timed", messages=message)
    online = answer.model_extra["engine_s"]
    assert online >= 0.05
    streamed = alpha.chat.completions.create(
        model="timed", messages=message, stream=True, stream_options={"include_usage": True}
    )
    (last,) = [chunk for chunk in streamed if chunk.usage is not None]
    assert last.model_extra["engine_s"] >= 0.05  # up to its last part
    online += last.model_extra["engine_s"]
    # A stream is recorded before its [DONE] goes out: the openai client, having read it,
    # closes the connection, and what the server would do after the stream is cancelled.
    assert sum(row["requests"] for row in online_rows(service)) == 2

    env = {**os.environ, "RELAYLLM_BASE_URL": service["url"], "RELAYLLM_API_KEY": ADMIN_KEY}
    env.pop("OPENAI_API_KEY", None)
    since = ["--start", str(service["began"] - 60), "--bucket", "1d", "--group-by", "batch"]
    by_kind = {True: 0.0, False: 0.0}
    for bucket in json.loads(cli("usage", *since, "--json", env=env, check=0).stdout):
        for r in bucket["results"]:
            by_kind[r["batch"]] += r["engine_s"]
    assert by_kind[True] == pytest.approx(charged.engine_s, abs=1e-5)
    recorded = online_rows(service)  # what the ledger holds, said if the sums differ
    assert by_kind[False] == pytest.approx(online, abs=1e-5), (recorded, answer, last)
    table = cli("usage", *since, env=env, check=0).stdout.splitlines()
    assert table[0].split()[-1] == "engine_s"
