"""Images in chat rows without a cluster or a network: data URLs and local files checked and
decoded, bad ones named, text-only chats left alone, pipeline image parts (fetching from a
loopback server and the stage: tests/core/test_images.py)."""

import io

import pytest
from PIL import Image

from relayllm.stage.images import has_images, prepare_images

# Registered for each test and removed after it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("echo_backend")


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


GOOD = png(7, 5)


def chat(url: str, text: str = "what is this") -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]


def test_text_only_chats_are_left_alone():
    messages = [{"role": "user", "content": "hi"}]
    assert not has_images(messages) and prepare_images(messages) == messages


PIPELINE = """\
deployments:
  - name: image-echo
    backend: echo
input:
  id_column: id
  rows:
    - {id: 0, picture: "pics/wide.png"}
    - {id: 1, picture: "PICTURE_ABSOLUTE"}
    - {id: 2, picture: "SERVER/cat.png"}
    - {id: 3, picture: "pics/missing.png"}
steps:
  - name: describe
    deployment: image-echo
    messages:
      - role: user
        content:
          - {type: text, text: "what is {id}"}
          - {type: image_url, image_url: {url: "{picture}", detail: low}}
    output_column: description
"""


def test_a_pipeline_image_part_names_its_column_and_field(tmp_path):
    from relayllm.pipelines import PipelineError, load_pipeline

    (tmp_path / "p.yaml").write_text(PIPELINE.replace('"{picture}"', '"{photo}"'))
    with pytest.raises(PipelineError) as info:
        load_pipeline(tmp_path / "p.yaml").check_columns(["id", "picture"])
    assert "column 'photo' is not in the input" in str(info.value)
    assert "steps[0].messages[0].content[1].image_url.url" in str(info.value), str(info.value)
    (tmp_path / "p.yaml").write_text(PIPELINE.replace("type: image_url,", "type: video,"))
    with pytest.raises(PipelineError):
        load_pipeline(tmp_path / "p.yaml")
