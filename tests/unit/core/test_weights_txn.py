"""A weight update as a transaction, without Ray: the deployment's state (the ``ControlState``
class, driven in this process as its actor would be) begins it, each replica prepares (rows
held, the engine loaded, the gate kept closed), and the one outcome written is what every
replica applies: committed, the held rows run on the new version; aborted, the replica
reloads the committed checkpoint or retires. A replica that could not load retires, one that
started meanwhile adopts the outcome, and the state aborts an update nobody decides in time.
Digests: relayllm's of the checkpoint files, or the engine's checker; disagreeing ones abort."""

from __future__ import annotations

import asyncio

import pytest

from relayllm.errors import DeploymentPausedError, EngineFailedError
from relayllm.serving.control_state import ControlState
from relayllm.serving.controller import abort_reason
from relayllm.serving.replica import Replica
from relayllm.serving.weights import checkpoint_digest
from relayllm.testing.echo import EchoEngine, write_echo_checkpoint
from relayllm.testing.echo_options import EchoOptions

pytestmark = pytest.mark.usefixtures("echo_backend")


def _echo(engine: type[EchoEngine] = EchoEngine, **options) -> Replica:
    return Replica(engine, EchoOptions(**options), {"name": "unit"})


def _row(text: str) -> dict:
    return {"task": "completion", "prompt": text}


async def _turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _sync(replica: Replica, state: ControlState) -> None:
    """What the replica's long poll does: apply the state as it is now."""
    await replica.follower.apply(*(await state.get()))


async def _prepare(replica: Replica, state: ControlState, begun: int, update: dict) -> dict:
    """The replica's prepare step, once it has read the state that began the update (its
    long poll would have; outside Serve there is no state actor to read it from)."""
    await _sync(replica, state)
    return await replica.follower.prepare_weights(begun, update)


async def _committed(state: ControlState, replicas: list[Replica], source: str, version: str):
    """A whole update that commits (the steps the controller takes, in this process)."""
    update = {"txn": f"t-{version}", "source": source, "version": version}
    begun = await state.begin_weights(update, 60)
    answers = [await _prepare(r, state, begun, update) for r in replicas]
    assert abort_reason(dict(enumerate(answers))) is None, answers
    await state.finish_weights(update["txn"], True)
    for replica in replicas:
        await _sync(replica, state)


def test_a_prepared_replica_holds_its_rows_until_the_commit_then_runs_them_on_the_new_version(
    tmp_path,
):
    v2 = write_echo_checkpoint(tmp_path / "v2", "two")

    async def scenario():
        state, replica = ControlState(), _echo()
        update = {"txn": "t2", "source": v2, "version": "2"}
        begun = await state.begin_weights(update, 60)
        answer = await _prepare(replica, state, begun, update)
        assert answer["state"] == "prepared" and answer["digest"]
        held = asyncio.create_task(replica.process_batch([_row("held")]))
        await _turns()
        assert not held.done() and replica.engine.busy_rows == 0, "loaded, not committed: held"
        assert replica.weight_version is None, "the version is not taken before the commit"
        with pytest.raises(DeploymentPausedError, match="updating its weights"):
            await replica.serve_http_row(_row("http"))
        _, committed = await state.finish_weights("t2", True)
        assert committed
        await _sync(replica, state)
        (row,) = await asyncio.wait_for(held, 5)
        assert (row["generated_text"], row["weight_version"]) == ("[two] held", "2")
        assert (await replica.serve_http_row(_row("http")))["weight_version"] == "2"

    asyncio.run(scenario())


def test_an_abort_reloads_the_committed_checkpoint_and_the_held_rows_keep_its_version(tmp_path):
    v1 = write_echo_checkpoint(tmp_path / "v1", "one")
    v2 = write_echo_checkpoint(tmp_path / "v2", "two")

    async def scenario():
        state, replica = ControlState(), _echo()
        await _committed(state, [replica], v1, "1")
        update = {"txn": "t2", "source": v2, "version": "2"}
        begun = await state.begin_weights(update, 60)
        assert (await _prepare(replica, state, begun, update))["state"] == "prepared"
        assert replica.engine.weights_tag == "two", "the engine loaded the new weights"
        held = asyncio.create_task(replica.process_batch([_row("held")]))
        await _turns()
        assert not held.done()
        _, committed = await state.finish_weights("t2", False)
        assert not committed
        await _sync(replica, state)
        (row,) = await asyncio.wait_for(held, 5)
        assert (row["generated_text"], row["weight_version"]) == ("[one] held", "1")
        assert replica.engine.weights_tag == "one" and replica.follower.retired is None

    asyncio.run(scenario())


def test_an_abort_from_the_weights_it_was_deployed_with_retires_the_replica(tmp_path):
    """No checkpoint to reload: the replica cannot get back to the committed weights, so it
    serves nothing more (Serve replaces it with one that starts on them)."""
    v2 = write_echo_checkpoint(tmp_path / "v2", "two")

    async def scenario():
        state, replica = ControlState(), _echo()
        update = {"txn": "t2", "source": v2, "version": "2"}
        begun = await state.begin_weights(update, 60)
        assert (await _prepare(replica, state, begun, update))["state"] == "prepared"
        await state.finish_weights("t2", False)
        await _sync(replica, state)
        assert replica.follower.retired and replica.watch.failure
        assert not replica.follower.open
        with pytest.raises(EngineFailedError):
            await replica.process_batch([_row("x")])

    asyncio.run(scenario())


def test_a_replica_that_cannot_read_the_checkpoint_answers_failed_and_retires(tmp_path):
    v2 = write_echo_checkpoint(tmp_path / "v2", "two", unreadable_by=[None])  # outside Serve

    async def scenario():
        state, bad = ControlState(), _echo()
        update = {"txn": "t2", "source": v2, "version": "2"}
        begun = await state.begin_weights(update, 60)
        bad_answer = await _prepare(bad, state, begun, update)
        assert bad_answer["state"] == "retired" and "Permission denied" in bad_answer["error"]
        assert bad.watch.failure and "could not load" in bad.watch.failure
        reason = abort_reason({"good": {"state": "prepared", "digest": "d"}, "bad": bad_answer})
        assert reason is not None and "bad: retired" in reason
        # A checkpoint that is not there never reaches the engine: the replica keeps its
        # weights and serves on once the update is aborted.
        state, missing = ControlState(), _echo()
        update = {"txn": "t3", "source": str(tmp_path / "nowhere"), "version": "3"}
        begun = await state.begin_weights(update, 60)
        answer = await _prepare(missing, state, begun, update)
        assert answer["state"] == "failed" and missing.watch.failure is None
        await state.finish_weights("t3", False)
        await _sync(missing, state)
        (row,) = await missing.process_batch([_row("on")])
        assert (row["generated_text"], row["weight_version"]) == ("on", None)

    asyncio.run(scenario())


def test_a_replica_started_during_the_update_holds_its_rows_and_adopts_the_outcome(tmp_path):
    v1 = write_echo_checkpoint(tmp_path / "v1", "one")
    v2 = write_echo_checkpoint(tmp_path / "v2", "two")
    v3 = write_echo_checkpoint(tmp_path / "v3", "three")

    async def scenario():
        state, first = ControlState(), _echo()
        await _committed(state, [first], v1, "1")
        for txn, source, commit, version in (("t2", v2, False, "1"), ("t3", v3, True, "3")):
            update = {"txn": txn, "source": source, "version": version}
            begun = await state.begin_weights(update, 60)
            assert (await _prepare(first, state, begun, update))["state"] == "prepared"
            late = _echo()  # started now: it reads the state with the update pending
            await _sync(late, state)
            assert late.weight_version == "1" and late.updating_weights
            held = asyncio.create_task(late.process_batch([_row("late")]))
            await _turns()
            assert not held.done(), "a replica started during the update holds its rows"
            await state.finish_weights(txn, commit)
            for replica in (first, late):
                await _sync(replica, state)
            (row,) = await asyncio.wait_for(held, 5)
            tag = {"1": "one", "3": "three"}[version]
            assert (row["generated_text"], row["weight_version"]) == (f"[{tag}] late", version)
            assert first.weight_version == version

    asyncio.run(scenario())


def test_the_state_aborts_an_update_nobody_decides_and_takes_one_at_a_time(tmp_path):
    async def scenario():
        state = ControlState()
        update = {"txn": "t1", "source": str(tmp_path), "version": "1"}
        await state.begin_weights(update, 0.05)
        with pytest.raises(RuntimeError, match="under way"):
            await state.begin_weights({**update, "txn": "t2"}, 60)
        changed = state.version
        await state.wait(changed, 10)  # until the deadline's own write
        _, now = await state.get()
        assert now["weights_pending"] is None and now["weights"] is None
        _, committed = await state.finish_weights("t1", True)
        assert not committed, "a commit after the deadline fails closed"
        assert (await state.get())[1]["weights"] is None

    asyncio.run(scenario())


class _Unchecked(EchoEngine):
    """An engine without a weight checker: the replica digests the checkpoint's files."""

    async def weights_digest(self) -> None:  # type: ignore[override]
        return None


def test_digests_the_files_without_a_checker_and_disagreeing_weights_abort(tmp_path):
    v2 = write_echo_checkpoint(tmp_path / "v2", "two")
    wrong = write_echo_checkpoint(tmp_path / "wrong", "two", tag_by={"None": "bent"})
    (tmp_path / "v2" / "shard.bin").write_bytes(b"\1" * 100)

    async def scenario():
        state, replica = ControlState(), _echo(_Unchecked)
        update = {"txn": "t2", "source": v2, "version": "2"}
        answer = await _prepare(replica, state, await state.begin_weights(update, 60), update)
        assert answer["digest"] == checkpoint_digest(v2)
        assert checkpoint_digest(wrong) != checkpoint_digest(v2)
        await state.finish_weights("t2", False)
        # Echo's checker digests the tag it holds: the same files, loaded wrong, differ.
        checked = [_echo(), _echo()]
        checked[1].engine.update_weights = _loads_wrong(checked[1].engine)
        update = {"txn": "t3", "source": v2, "version": "3"}
        begun = await state.begin_weights(update, 60)
        answers = {i: await _prepare(r, state, begun, update) for i, r in enumerate(checked)}
        assert answers[0]["digest"] != answers[1]["digest"]
        assert "different weights" in (abort_reason(answers) or "")
        same = {0: answers[0], 1: {**answers[1], "digest": answers[0]["digest"]}}
        assert abort_reason(same) is None

    asyncio.run(scenario())


def _loads_wrong(engine: EchoEngine):
    load = engine.update_weights

    async def update_weights(path: str, version: str) -> None:
        await load(path, version)
        engine.weights_tag = f"{engine.weights_tag}-bent"  # the transfer landed wrong here

    return update_weights
