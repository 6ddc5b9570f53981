"""The usage ledger turned off end to end: ``relayllm serve --no-record-usage`` on the echo
backend (a subprocess, as an operator runs it), the real ``openai`` client on loopback. A batch
completes with every line in its output file and an online request is answered with its
``usage``, and the ledger records neither: the Usage API answers empty buckets and the job
store's usage table has no row. (Recording on is tested in test_tenants.py: the Usage API
equals the sums over the output files.)"""

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
  - name: echo
    backend: echo
"""


@pytest.fixture(scope="module")
def service(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("no-usage")
    url, address, _ = serve_echo(
        ray_session, root, DEPLOYMENTS, "--batch-size", 2, "--no-record-usage"
    )
    yield {"url": url, "state": str(root / "state"), "began": int(time.time())}
    cli("unserve", "--address", address, check=0)


def test_with_recording_off_batches_and_online_requests_are_served_and_nothing_is_recorded(
    service,
):
    from relayllm_service.settings import ServiceSettings
    from relayllm_service.tenancy.usage import UsageLedger

    alpha = client(service["url"], PROJECT_KEYS["alpha"])
    batch = wait(alpha, submit(alpha, chat_lines(6)).id)
    assert batch.status == "completed", batch
    output = lines_of(alpha, batch.output_file_id)
    assert sorted(line["custom_id"] for line in output) == [f"r{i}" for i in range(6)]
    assert all(line["response"]["body"]["usage"]["prompt_tokens"] > 0 for line in output)
    message = [{"role": "user", "content": "how many words are here"}]
    answer = alpha.chat.completions.create(model="echo", messages=message)
    assert answer.usage.prompt_tokens > 0

    admin = openai.OpenAI(
        base_url=service["url"], api_key=ADMIN_KEY, admin_api_key=ADMIN_KEY, max_retries=0
    )
    page = admin.admin.organization.usage.completions(
        start_time=service["began"] - 60, end_time=int(time.time()) + 120, bucket_width="1h"
    )
    assert page.data and all(bucket.results == [] for bucket in page.data)
    ledger = UsageLedger(ServiceSettings(state_dir=service["state"]).store_path)
    try:
        assert ledger.batch_totals(batch.id) == {}
        assert ledger.rows(0, int(time.time()) + 120) == []
    finally:
        ledger.close()
