"""Images in chat rows without a cluster or a network: data URLs and local files checked and
decoded, bad ones named, text-only chats left alone, local files refused alike whether they
exist or not when a processor may not read them (the batch service's), pipeline image parts
(fetching from a loopback server and the stage: tests/core/test_images_on_ray.py)."""

import asyncio
import base64
import os

import pytest
from samples import IMAGES_PIPELINE, chat, png

from relayllm import ProcessorConfig
from relayllm.stage.images import (
    ImageError,
    ImageLimits,
    checked_data_url,
    has_images,
    prepare_images,
    prepare_pending,
    read_image_bytes,
)

# Registered for each test and removed after it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("echo_backend")


GOOD = png(7, 5)


def test_text_only_chats_are_left_alone():
    messages = [{"role": "user", "content": "hi"}]
    assert not has_images(messages) and prepare_images(messages) == messages


def test_local_files_off_refuse_an_existing_and_a_missing_path_alike(tmp_path, monkeypatch):
    here = tmp_path / "cat.png"
    here.write_bytes(GOOD)
    gone = tmp_path / "gone.png"
    urls = [str(here), here.as_uri(), str(gone), gone.as_uri()]
    # On (a user's own pipeline, the default): the file is read, a missing one is named.
    assert ProcessorConfig(deployment="d").local_image_files is True
    for url in urls[:2]:
        out = checked_data_url(url)
        assert base64.b64decode(out.split(",", 1)[1]) == GOOD
    assert f"cannot read {gone}" in prepare_images(chat(str(gone)))
    # Off: refused from the string alone, before the file system is looked at.
    off = ImageLimits(local_files=False)

    def looked(*args, **kwargs):
        raise AssertionError("the file system was looked at")

    monkeypatch.setattr(os.path, "getsize", looked)
    refusals = set()
    for url in urls:
        with pytest.raises(ImageError) as info:
            read_image_bytes(url, off)
        refusals.add(str(info.value))
        refusals.add(prepare_images(chat(url), off))
    assert refusals == {
        "local image files are not allowed here: use http(s):// or data:",
        "messages[0].content[1].image_url: local image files are not allowed here: "
        "use http(s):// or data:",
    }
    data = "data:image/png;base64," + base64.b64encode(GOOD).decode()
    assert isinstance(prepare_images(chat(data), off), list)  # other sources still read


def test_the_stage_fails_only_the_rows_with_a_local_file_when_off(tmp_path):
    here = tmp_path / "cat.png"
    here.write_bytes(GOOD)
    data = "data:image/png;base64," + base64.b64encode(GOOD).decode()
    urls = [str(here), str(tmp_path / "gone.png"), data]
    pending = [(i, {"messages": chat(u)}) for i, u in enumerate(urls)]
    results: list[dict] = [{}] * 3
    sent = asyncio.run(prepare_pending(list(pending), results, local_files=False))
    assert [i for i, _ in sent] == [2]
    assert results[0] == results[1] and "not allowed" in results[0]["error"]
    assert results[2] == {}
    results = [{}] * 3
    sent = asyncio.run(prepare_pending(list(pending), results))  # on: the stage's default
    assert [i for i, _ in sent] == [0, 2] and "cannot read" in results[1]["error"]


def test_a_local_file_that_is_not_an_image_is_not_quoted(tmp_path):
    # Pillow's message for a PPM-looking header quotes a header token of the file.
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"P6\n" + b"SECRETTOKEN" * 20)
    for url in (str(secret), secret.as_uri()):
        problem = prepare_images(chat(url))
        assert isinstance(problem, str) and "not a readable image (ValueError)" in problem
        assert "SECRET" not in problem


def test_a_pipeline_image_part_names_its_column_and_field(tmp_path):
    from relayllm.pipelines import PipelineError, load_pipeline

    (tmp_path / "p.yaml").write_text(IMAGES_PIPELINE.replace('"{picture}"', '"{photo}"'))
    with pytest.raises(PipelineError) as info:
        load_pipeline(tmp_path / "p.yaml").check_columns(["id", "picture"])
    assert "column 'photo' is not in the input" in str(info.value)
    assert "steps[0].messages[0].content[1].image_url.url" in str(info.value), str(info.value)
    (tmp_path / "p.yaml").write_text(IMAGES_PIPELINE.replace("type: image_url,", "type: video,"))
    with pytest.raises(PipelineError):
        load_pipeline(tmp_path / "p.yaml")
