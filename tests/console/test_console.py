"""The batch service's console in a real browser: Debian's Chromium, headless, driven by
Playwright, against ``relayllm serve`` on the echo backend, asserting what a person sees --
the sign-in page without a key, a running batch's row with its progress advancing as the page
renews itself, its metadata shown as text, a download link that saves the same bytes the
``openai`` client reads, and a project's key that sees only its project.

One service and one browser for the module. ``RELAYLLM_CONSOLE_SCREENSHOT=PATH`` saves a
screenshot of the page there (the docs' picture: docs/img/console.png)."""

import json
import os

import pytest
from batch_api import ADMIN_KEY, PROJECT_KEYS, chat_lines, client, serve_echo, submit, wait

pytestmark = pytest.mark.usefixtures("ray_session")

CHROMIUM = "/usr/bin/chromium"
#: Without the background-networking flags Chromium keeps calling out to a closed network.
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT_ENV = "RELAYLLM_CONSOLE_SCREENSHOT"
HOSTILE = "<script>window.pwned=1</script>"
LINES = 60

DEPLOYMENTS = """\
deployments:
  - name: echo
    backend: echo
    options:
      delay_s: 0.4
"""


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        message = (
            f"{CHROMIUM} is missing: apt-get install -y --no-install-recommends chromium "
            "(tox -e console installs it when run as root)"
        )
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)  # CI must run the browser test, never skip it
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def service(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("console")
    url, address, _ = serve_echo(ray_session, root, DEPLOYMENTS, "--batch-size", 2)
    yield {"url": url, "console": url.removesuffix("/v1") + "/console", "address": address}
    from support import cli

    cli("unserve", "--address", address, check=0)


def signed_in(browser, service, key, tmp_path=None):
    context = browser.new_context(accept_downloads=True, viewport={"width": 1366, "height": 800})
    page = context.new_page()
    page.goto(service["console"])
    page.fill("input[name=key]", key)
    page.click("button[type=submit]")
    page.wait_for_selector("h2:has-text('Deployments')")
    return context, page


def progress_of(page, batch_id):
    text = page.locator(f"tr[data-batch='{batch_id}'] .progress").inner_text()
    done, total = map(int, text.split("/"))
    return done, total


def test_without_a_key_the_console_asks_for_one_and_refuses_a_wrong_one(browser, service):
    context = browser.new_context()
    page = context.new_page()
    shown = page.goto(service["console"])
    assert shown.status == 401
    assert page.locator("input[name=key][type=password]").is_visible()
    assert page.locator("table").count() == 0  # nothing of any project
    page.fill("input[name=key]", "wrong-key-" + "w" * 24)
    page.click("button[type=submit]")
    assert page.get_by_role("alert").inner_text() == "That key was refused."
    assert page.locator("table").count() == 0
    assert [c["name"] for c in context.cookies()] == []  # no session for a refused key
    download = page.request.get(service["console"] + "/files/file-" + "a" * 24)
    assert download.status == 401
    context.close()


def test_a_running_batch_advances_on_the_page_and_its_output_downloads(browser, service, tmp_path):
    alpha = client(service["url"], PROJECT_KEYS["alpha"])
    batch = submit(alpha, chat_lines(LINES), metadata={"note": HOSTILE})
    wait(alpha, batch.id, until=lambda b: b.status == "in_progress")
    context, page = signed_in(browser, service, ADMIN_KEY)
    cookie = context.cookies()[0]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert ADMIN_KEY not in cookie["value"]
    row = page.locator(f"tr[data-batch='{batch.id}']")
    assert row.is_visible()
    assert page.locator("section[data-project='alpha'] h2").inner_text() == "Project alpha"
    first, total = progress_of(page, batch.id)
    assert total == LINES and first < LINES
    # the page renews itself (no reload by the test): the count moves on while it runs
    page.wait_for_function(
        f"""() => {{
            const cell = document.querySelector("tr[data-batch='{batch.id}'] .progress");
            return cell && parseInt(cell.textContent) > {first};
        }}""",
        timeout=60_000,
    )
    assert progress_of(page, batch.id)[0] > first
    if os.environ.get(SCREENSHOT_ENV):  # the docs' picture, where the one who asks says
        page.screenshot(path=os.environ[SCREENSHOT_ENV], full_page=True)
    # the metadata is shown as the text it is, and ran nothing
    assert HOSTILE in row.locator("td").nth(6).inner_text()
    assert page.evaluate("() => window.pwned") is None
    # the deployment behind it, with its replica's rows
    deployment = page.locator("section:has(h2:has-text('Deployments')) tbody tr").first
    cells = deployment.locator("td").all_inner_texts()
    assert cells[0] == "echo" and cells[1] == "RUNNING" and cells[2] == "echo"
    assert int(cells[7]) > 0  # rows answered by the replica
    row.locator("text=completed").wait_for(timeout=120_000)
    assert progress_of(page, batch.id) == (LINES, LINES)
    finished = alpha.batches.retrieve(batch.id)
    with page.expect_download() as downloading:
        row.get_by_role("link", name="output").click()
    saved = tmp_path / "output.jsonl"
    downloading.value.save_as(saved)
    expected = alpha.files.content(finished.output_file_id).content
    assert saved.read_bytes() == expected and len(expected.splitlines()) == LINES
    assert downloading.value.suggested_filename.startswith(batch.id)
    # its tokens, as the usage ledger charged them: the output lines' usage summed
    usage = [json.loads(line)["response"]["body"]["usage"] for line in expected.splitlines()]
    tokens_in = sum(u["prompt_tokens"] for u in usage)
    tokens_out = sum(u["completion_tokens"] for u in usage)
    assert tokens_in > 0 and tokens_out > 0
    shown = row.locator(".tokens").inner_text()
    assert shown == f"{tokens_in:,} / {tokens_out:,}"
    context.close()


def test_a_project_key_sees_only_its_projects_batches(browser, service):
    alpha, beta = (
        client(service["url"], PROJECT_KEYS["alpha"]),
        client(service["url"], PROJECT_KEYS["beta"]),
    )
    mine = wait(beta, submit(beta, chat_lines(2, prefix="b")).id)
    theirs = wait(alpha, submit(alpha, chat_lines(2, prefix="a")).id)
    context, page = signed_in(browser, service, PROJECT_KEYS["beta"])
    assert page.locator("header span").inner_text() == "project beta"
    assert page.locator("section[data-project]").evaluate_all(
        "all => all.map(s => s.dataset.project)"
    ) == ["beta"]
    assert page.locator(f"tr[data-batch='{mine.id}']").is_visible()
    assert theirs.id not in page.content()
    # another project's file is no file here, cookie or not
    refused = page.request.get(service["console"] + f"/files/{theirs.output_file_id}")
    assert refused.status == 404
    own = page.request.get(service["console"] + f"/files/{mine.output_file_id}")
    assert own.status == 200 and own.body() == beta.files.content(mine.output_file_id).content
    # signing out ends the session: the page asks for a key again
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_selector("input[name=key]")
    assert context.cookies() == []
    context.close()
