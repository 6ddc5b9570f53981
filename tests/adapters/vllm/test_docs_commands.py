"""docs/batch-service.md followed top to bottom as the page gives it, on the demo model: its
"Start it" commands, its "Use it" snippet with the real ``openai`` client on the sample request
file, its "Operate it" commands, and the console showing the batch. The blocks are read from
the page itself, so a page that drifts from the product fails here.

What differs from a person at a terminal, and why:

- ``pip install`` lines are not run: this environment has the packages (installed editable;
  a second install would replace that).
- ``ray start --head`` is not run: the suite's cluster is already up (one vLLM engine at a
  time on this machine), and its address stands in for the page's ``127.0.0.1:6379``. The
  page's ``relayllm serve`` then reuses the suite's running ``smollm`` engine, and gets
  ``--port`` of the suite's Serve proxy (Serve has one proxy per cluster); its state goes to a
  temporary ``RELAYLLM_STATE_DIR``, not the home directory.
- "Start it" runs in the clone (its paths are the clone's); the snippet and "Operate it" run
  in a temporary folder (the sample request file copied there as ``requests.jsonl``; the
  downloads land there, never among tracked files).
- The snippet's ``TEAM_A_KEY`` is team-a's key from the page's own ``RELAYLLM_API_KEYS``, and
  the placeholder ids of "Operate it" are the batch's and file's real ids.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from support import REPO, wait_for
from vllm_support import HTTP_PORT, cli_env, is_quiet, only_replica_info

PAGE = REPO / "docs" / "batch-service.md"


def blocks(heading: str, lang: str) -> list[str]:
    """The ``lang`` code blocks under ``## heading`` of the page, in order."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, flags=re.S)


def bash(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in bash, stopping at the first failing line; the environment it ends
    with is printed after a marker, for the next block (as one terminal session)."""
    marker = "@@ENV@@"
    done = subprocess.run(
        ["bash", "-ec", f"{script}\necho {marker}\nenv -0"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"{script}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    out, _, dumped = done.stdout.partition(f"{marker}\n")
    env.clear()
    env.update(item.split("=", 1) for item in dumped.split("\0") if "=" in item)
    return subprocess.CompletedProcess(done.args, 0, out, done.stderr)


@pytest.fixture(scope="module")
def terminal(demo_deployed, address, tmp_path_factory):
    """One terminal session's environment and folder, with the page's service started."""
    folder = tmp_path_factory.mktemp("docs-terminal")
    env = {**cli_env(address, with_address=False), "RELAYLLM_STATE_DIR": str(folder / "state")}
    # The environment's commands (relayllm) first on the PATH, as in an activated venv.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    (start,) = blocks("Start it", "bash")
    lines = []
    for line in start.splitlines():
        if line.startswith(("pip install", "ray start")):
            continue
        if line.startswith("relayllm serve"):
            line = line.replace("127.0.0.1:6379", address) + f" --port {HTTP_PORT}"
        lines.append(line)
    served = bash("\n".join(lines), env, REPO)  # the page's paths are the clone's
    yield env, folder, served.stdout
    bash(f"relayllm unserve --address {address}", env, folder)
    # The engine is shared with the demo group's next modules, which count its rows: the rows
    # of the cancelled batch, computed on after their caller left, end before they start.
    import relayllm

    engine = relayllm.control("smollm")
    wait_for(
        lambda: is_quiet(only_replica_info(engine)),
        "the shared engine has no call or row of this page's batches left",
        timeout_s=300,
    )


def test_the_pages_commands_start_serve_operate_and_show_a_batch(terminal):
    env, folder, started = terminal
    # "Start it": what the page says the command prints.
    printed = blocks("Start it", "text")[0]
    for expected in printed.splitlines():
        if expected.startswith(("smollm: RUNNING", "base URL:")):
            assert expected in started, (expected, started)
    assert "gateway: RUNNING (2 API keys" in started, started
    base_url = started.split("base URL: ")[1].split()[0]

    # "Use it": the snippet as written, on the sample request file.
    shutil.copy(REPO / "examples" / "batch" / "requests.jsonl", folder / "requests.jsonl")
    team_a = dict(kv.split("=", 1) for kv in env["RELAYLLM_API_KEYS"].split(","))["team-a"]
    (snippet,) = blocks("Use it", "python")
    script = (
        f"TEAM_A_KEY = {team_a!r}\n{snippet}\n"
        "import json\n"
        "print(json.dumps({'batch': batch.id, 'status': batch.status, "
        "'input': batch.input_file_id, 'output_file': batch.output_file_id, "
        "'output': output}))\n"
    )
    used = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=folder, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert used.returncode == 0, used.stderr[-3000:]
    result = json.loads(used.stdout.strip().splitlines()[-1])
    assert result["status"] == "completed", result
    sent = [
        json.loads(x)["custom_id"] for x in (folder / "requests.jsonl").read_text().splitlines()
    ]
    answered = [json.loads(x) for x in result["output"].splitlines()]
    assert sorted(a["custom_id"] for a in answered) == sorted(sent), "each request once"
    for answer in answered:  # the sample file samples (no temperature): any text, OpenAI's shape
        body = answer["response"]["body"]
        assert answer["response"]["status_code"] == 200 and body["model"] == "smollm", answer
        assert body["choices"][0]["message"]["content"] and body["usage"]["prompt_tokens"] > 0

    # "Operate it": the page's commands, its placeholder ids the real ones: a second batch of
    # the same file for the cancel (a finished batch cannot be cancelled; the deployment is
    # paused meanwhile, so that batch waits in progress however fast the engine is), the
    # finished batch's output file for the delete (once downloaded).
    import openai

    import relayllm

    client = openai.OpenAI(base_url=base_url, api_key=team_a)
    engine = relayllm.control("smollm")
    engine.pause()
    try:
        other = client.batches.create(
            input_file_id=result["input"], endpoint="/v1/chat/completions", completion_window="24h"
        )
        (operate,) = blocks("Operate it", "bash")
        lines = []
        for line in operate.splitlines():
            batch_id = other.id if " cancel " in line else result["batch"]
            lines.append(
                line.replace("batch_0123abcd", batch_id).replace(
                    "file-0123abcd", result["output_file"]
                )
            )
        operated = bash("\n".join(lines), env, folder).stdout
    finally:
        engine.resume()
    assert result["batch"] in operated and "completed" in operated, operated
    assert (folder / f"{result['batch']}_output.jsonl").read_text() == result["output"]

    # The console shows the batch (a script's way in: the admin key as a bearer header).
    root = base_url.removesuffix("/v1")
    page = urllib.request.Request(
        f"{root}/console", headers={"Authorization": f"Bearer {env['RELAYLLM_ADMIN_KEY']}"}
    )
    with urllib.request.urlopen(page, timeout=60) as answer:
        html = answer.read().decode()
    assert result["batch"] in html and "team-a" in html, html[:2000]
    assert client.batches.retrieve(other.id).status in ("cancelling", "cancelled")
