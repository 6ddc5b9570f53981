"""Images in chat rows: ``image_url`` parts (http(s) from a real loopback server, data URLs,
local files) fetched and decoded with Pillow on the CPU workers, with size and time limits;
a bad URL or a corrupt image fails its row only. Through the stage on the echo backend, which
answers with the size of each image that reached it."""

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import ray
from samples import IMAGES_PIPELINE, chat, png
from support import SHARED_ECHO

import relayllm
from relayllm import ProcessorConfig, build_processor
from relayllm.stage.images import ImageLimits, checked_data_url, prepare_images

pytestmark = pytest.mark.usefixtures("ray_session")

ECHO = SHARED_ECHO  # the `echo` fixture's deployment: the session's, shared


GOOD = png(7, 5)
CORRUPT = GOOD[:40]  # a PNG header, then nothing: Pillow identifies it, load() fails


class _Images(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/slow"):
            time.sleep(3)
        body = {"/cat.png": GOOD, "/slow.png": GOOD, "/broken.png": CORRUPT}.get(self.path)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # keep the test output quiet
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_every_source_becomes_a_checked_data_url(server, tmp_path):
    local = tmp_path / "cat.png"
    local.write_bytes(GOOD)
    data = "data:image/png;base64," + base64.b64encode(GOOD).decode()
    for url in (f"{server}/cat.png", data, str(local), local.as_uri()):
        out = checked_data_url(url)
        assert out.startswith("data:image/png;base64,")
        assert base64.b64decode(out.split(",", 1)[1]) == GOOD  # the same bytes travel on


@pytest.mark.parametrize(
    "url, limits, message",
    [
        ("{server}/missing.png", ImageLimits(), "answered HTTP 404"),
        ("{server}/broken.png", ImageLimits(), "not a readable image"),
        ("{server}/slow.png", ImageLimits(timeout_s=0.5), "cannot fetch from http://127.0.0.1"),
        ("{server}/cat.png", ImageLimits(max_bytes=50), "over the 50 byte limit"),
        ("{server}/cat.png", ImageLimits(max_pixels=20), "7x5, over the 20 pixel limit"),
        ("data:image/png;base64,@@@", ImageLimits(), "not valid base64"),
        ("data:image/png,rawtext", ImageLimits(), "must be base64"),
        ("ftp://host/cat.png", ImageLimits(), "unsupported image URL"),
        ("/no/such/file.png", ImageLimits(), "cannot read /no/such/file.png"),
    ],
)
def test_a_bad_image_names_the_part_and_why(server, url, limits, message):
    problem = prepare_images(chat(url.format(server=server)), limits)
    assert isinstance(problem, str)
    assert problem.startswith("messages[0].content[1].image_url: ") and message in problem


def test_an_error_never_shows_the_url_path_or_query(server):
    problem = prepare_images(chat(f"{server}/missing.png?sig=SECRET"))
    assert "SECRET" not in problem and "missing.png" not in problem


def test_images_reach_the_deployment_and_bad_ones_fail_their_row(echo, server, tmp_path):
    local = tmp_path / "wide.png"
    local.write_bytes(png(12, 3))
    data = "data:image/png;base64," + base64.b64encode(png(2, 9)).decode()
    urls = [f"{server}/cat.png", data, str(local), f"{server}/missing.png", f"{server}/broken.png"]
    rows = [{"id": i, "messages": chat(u)} for i, u in enumerate(urls)]
    rows.append({"id": 5, "messages": [{"role": "user", "content": "plain text"}]})
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    # One block: string and list contents differ in shape (see docs/architecture.md).
    out = build_processor(ProcessorConfig(deployment=ECHO["name"]))(
        ray.data.from_items(rows, override_num_blocks=1)
    ).take_all()
    assert [r["id"] for r in out] == [0, 1, 2, 3, 4, 5]
    answers = [r["generated_text"] for r in out]
    assert answers[0] == "what is this <image:7x5>"
    assert answers[1] == "what is this <image:2x9>"
    assert answers[2] == "what is this <image:12x3>"
    assert "HTTP 404" in out[3]["error"] and answers[3] is None
    assert "not a readable image" in out[4]["error"]
    assert out[5]["error"] is None and answers[5] == "plain text"


def test_a_pipeline_steps_image_part_is_a_template_and_reads_paths_from_its_folder(
    echo, server, tmp_path
):
    """A step's message content may be OpenAI's parts; ``text`` and ``image_url.url`` are
    templates, and a relative path is read from the pipeline file's folder (as input.path),
    not the current directory."""
    from relayllm.pipelines import load_pipeline

    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "wide.png").write_bytes(png(12, 3))
    absolute = tmp_path / "tall.png"
    absolute.write_bytes(png(2, 9))
    text = IMAGES_PIPELINE.replace("PICTURE_ABSOLUTE", str(absolute)).replace("SERVER", server)
    (tmp_path / "p.yaml").write_text(text)
    step = load_pipeline(tmp_path / "p.yaml").spec.steps[0]
    assert step.messages[0].content[1].image_url.detail == "low"
    out = tmp_path / "out.jsonl"
    relayllm.run_pipeline(tmp_path / "p.yaml", output=str(out), keep_deployments=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["description"] for r in rows[:3]] == [
        "what is 0 <image:12x3>",
        "what is 1 <image:2x9>",
        "what is 2 <image:7x5>",
    ], rows
    assert rows[3]["description"] is None
    assert f"cannot read {tmp_path / 'pics' / 'missing.png'}" in rows[3]["error"]
