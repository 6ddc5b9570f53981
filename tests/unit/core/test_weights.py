"""Weight updates inside one replica, without Ray (echo's "weights" are a tag every answer
starts with): the rows in the engine finish on the old weights with the old version, the rows
held during the update run on the new ones with the new version, HTTP rows are refused (503)
meanwhile; a checkpoint URI is copied to a local directory and removed after the load; and
``weight_version`` in the response bodies."""

from __future__ import annotations

import asyncio
import os

import pytest

from relayllm.openai_body import completion_body, embeddings_body
from relayllm.serving.replica import Replica
from relayllm.serving.weights import fetch_checkpoint
from relayllm.testing.echo import EchoEngine, write_echo_checkpoint
from relayllm.testing.echo_options import EchoOptions

pytestmark = pytest.mark.usefixtures("echo_backend")


def _echo(**options) -> Replica:
    return Replica(EchoEngine, EchoOptions(**options), {"name": "unit"})


def _row(text: str) -> dict:
    return {"task": "completion", "prompt": text}


async def _turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _updating(replica: Replica) -> None:
    """Until the replica's update holds its gate (the checkpoint is looked up in a thread)."""
    for _ in range(500):
        if replica.updating_weights:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the update never started")


def test_rows_in_the_engine_keep_the_old_version_and_held_rows_get_the_new(tmp_path):
    v2 = write_echo_checkpoint(tmp_path / "v2", "two")

    async def scenario():
        replica = _echo(delay_s=0.3)
        assert (await replica.process_batch([_row("before")]))[0]["weight_version"] is None
        inside = asyncio.create_task(replica.process_batch([_row("inside")]))
        await _turns()
        assert replica.engine.busy_rows == 1, "a row is in the engine"
        update = asyncio.create_task(replica.control("update_weights", v2, "2"))
        await _updating(replica)
        held = asyncio.create_task(replica.process_batch([_row("held")]))
        await _turns()
        assert replica.engine.busy_rows == 1, "the new row waits at the gate during the update"
        (first,) = await inside
        assert first["generated_text"] == "inside" and first["weight_version"] is None
        await asyncio.wait_for(update, 5)
        (second,) = await asyncio.wait_for(held, 5)
        assert second["generated_text"] == "[two] held" and second["weight_version"] == "2"
        assert await replica.control("weight_version") == "2"
        info = await replica.info()
        assert (info["weight_version"], info["weight_updates"]) == ("2", 1)

    asyncio.run(scenario())


def test_a_row_stamped_at_arrival_would_be_caught(tmp_path):
    """What the order above protects: a row that arrived before the update but entered the
    engine after it is answered by the new weights, so it must carry the new version."""
    v2 = write_echo_checkpoint(tmp_path / "v2", "two")

    async def scenario():
        replica = _echo(delay_s=0.2)
        first = asyncio.create_task(replica.process_batch([_row("a")]))
        await _turns()
        update = asyncio.create_task(replica.control("update_weights", v2, "2"))
        await _updating(replica)
        arrived = asyncio.create_task(replica.process_batch([_row("b")]))  # before the load
        await update
        (row,) = await arrived
        (early,) = await first
        assert row["generated_text"].startswith("[two]") and row["weight_version"] == "2"
        assert not early["generated_text"].startswith("[") and early["weight_version"] is None

    asyncio.run(scenario())


def test_http_rows_are_refused_during_an_update_and_stamped_after(tmp_path):
    from relayllm.errors import DeploymentPausedError

    v3 = write_echo_checkpoint(tmp_path / "v3", "three")

    async def scenario():
        replica = _echo(delay_s=0.2)
        inside = asyncio.create_task(replica.serve_http_row({**_row("http"), "request_id": "h"}))
        await _turns()
        update = asyncio.create_task(replica.control("update_weights", v3, "3"))
        await _updating(replica)
        assert not update.done(), "the update waits for the HTTP row in the engine too"
        with pytest.raises(DeploymentPausedError, match="updating its weights"):
            await replica.serve_http_row(_row("refused"))
        assert (await inside)["weight_version"] is None
        await update
        after = await replica.serve_http_row(_row("after"))
        assert after["generated_text"] == "[three] after" and after["weight_version"] == "3"

    asyncio.run(scenario())


def test_a_bad_checkpoint_fails_the_update_and_changes_nothing(tmp_path):
    async def scenario():
        replica = _echo()
        with pytest.raises(FileNotFoundError):
            await replica.control("update_weights", str(tmp_path / "missing"), "x")
        with pytest.raises(ValueError, match="not an echo checkpoint"):
            await replica.control("update_weights", str(tmp_path), "x")
        assert replica.follower.weight_version is None and replica.follower.open
        (row,) = await replica.process_batch([_row("still")])
        assert row["generated_text"] == "still" and row["weight_version"] is None

    asyncio.run(scenario())


def test_a_uri_checkpoint_is_copied_locally_and_removed_after(tmp_path):
    source = write_echo_checkpoint(tmp_path / "ckpt" / "v1", "one")
    (tmp_path / "ckpt" / "v1" / "sub").mkdir()
    (tmp_path / "ckpt" / "v1" / "sub" / "shard.bin").write_bytes(b"\0" * 1000)
    local, cleanup = fetch_checkpoint(f"file://{source}")
    assert local != source and os.path.isdir(local)
    assert sorted(os.listdir(local)) == ["echo_weights.json", "sub"]
    assert os.path.getsize(os.path.join(local, "sub", "shard.bin")) == 1000
    cleanup()
    assert not os.path.exists(local)
    same, nothing = fetch_checkpoint(source)  # a local directory is read where it is
    assert same == source
    nothing()
    assert os.path.isdir(source)
    with pytest.raises(FileNotFoundError):
        fetch_checkpoint(f"file://{tmp_path}/nowhere")


def test_bodies_carry_the_weight_version():
    row = {"generated_text": "hi", "finish_reason": "stop", "weight_version": "5"}
    assert completion_body("chat", row, "m", "r")["weight_version"] == "5"
    assert (
        completion_body("completion", {"generated_text": "x"}, "m", "r")["weight_version"] is None
    )
    same = [{"embedding": [1.0], "weight_version": "5"}] * 2
    assert embeddings_body(same, "m")["weight_version"] == "5"
    split = [
        {"embedding": [1.0], "weight_version": "5"},
        {"embedding": [1.0], "weight_version": "6"},
    ]
    assert embeddings_body(split, "m")["weight_version"] is None, "an update between the inputs"
