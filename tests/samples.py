"""Inputs that both tiers of a module's tests use: its unit test (tests/unit, no cluster)
checks them and its on-cluster test (tests/core) runs them. One copy, so the pipeline file a
unit test validates is the one the cluster runs, and a fix to an image builder reaches both.

Importable as ``samples`` from any test (pytest.ini puts ``tests/`` on the path), like
``support``; what only one test module uses stays in that module.
"""

from __future__ import annotations

import io

# -- pipeline files -----------------------------------------------------------------------------

#: One step on the echo backend, rows inline: the file the pipeline tests vary.
ONE_STEP = """\
deployments:
  - name: echo-a
    backend: echo
input:
  rows:
    - {id: 1, question: "hi there"}
steps:
  - name: answer
    deployment: echo-a
    messages:
      - role: user
        content: "{question}"
    output_column: answer
"""


def parse(text, tmp_path, name="p.yaml"):
    """The pipeline ``text``, written to ``tmp_path/name`` and loaded from there."""
    from relayllm.pipelines import load_pipeline

    path = tmp_path / name
    path.write_text(text)
    return load_pipeline(path)


#: The pooling tasks in one pipeline: classify (a label, then its probabilities), then score.
POOLING_PIPELINE = """\
deployments:
  - name: echo-pool
    backend: echo
input:
  rows:
    - {id: 1, post: "short one", topic: "short"}
    - {id: 2, post: "this post is rather long indeed", topic: "sky"}
steps:
  - name: kind
    deployment: echo-pool
    text: "{post}"
    output_column: kind
  - name: confidence
    deployment: echo-pool
    text: "{post}"
    output_column: confidence
    output_field: probs
  - name: relevance
    deployment: echo-pool
    query: "{topic}"
    document: "{post}"
    output_column: relevance
"""


#: A step whose message has an image part: ``{picture}`` holds a relative path, an absolute
#: one (PICTURE_ABSOLUTE) and a URL on the test's server (SERVER); one of them is missing.
IMAGES_PIPELINE = """\
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


# -- images -------------------------------------------------------------------------------------


def png(width: int, height: int) -> bytes:
    """A plain red PNG of that size."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def chat(url: str, text: str = "what is this") -> list[dict]:
    """A chat of one user message: ``text``, then the image at ``url``."""
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]
