"""The control plane inside one replica, without Ray: the pause gate (rows wait, in ``wait``
mode the rows in the engine finish first), refusals before anything changes, the HTTP front's
503 while paused, and the CLI's argument checks before any cluster is touched."""

from __future__ import annotations

import asyncio
import importlib
import pickle

import openai
import pytest

from relayllm.errors import ControlRefusedError
from relayllm.serving.control_state import CONTROL_CALLS
from relayllm.serving.replica import Replica
from relayllm.testing.echo import EchoEngine
from relayllm.testing.echo_options import EchoOptions

pytestmark = pytest.mark.usefixtures("echo_backend")


def _echo(**options) -> Replica:
    deployment = {"name": "unit", **options.pop("deployment", {})}
    return Replica(EchoEngine, EchoOptions(**options), deployment)


def _row(text: str, rid: str | None = None) -> dict:
    row = {"task": "completion", "prompt": text}
    if rid:
        row["request_id"] = rid
    return row


async def _turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_paused_replica_holds_batch_rows_until_resume():
    async def scenario():
        replica = _echo()
        await replica.follower.apply(1, {"paused": "wait"})
        call = asyncio.create_task(replica.process_batch([_row("held a"), _row("held b")]))
        await asyncio.sleep(0.2)
        assert not call.done() and replica.rows == 0, "the rows wait; they neither run nor fail"
        await replica.follower.apply(2, {"paused": None})
        results = await asyncio.wait_for(call, 5)
        assert [r["generated_text"] for r in results] == ["held a", "held b"]
        assert replica.rows == 2 and replica.paused is None

    asyncio.run(scenario())


def test_pause_in_wait_mode_returns_only_after_the_rows_in_the_engine_finish():
    async def scenario():
        replica = _echo(delay_s=0.3)
        call = asyncio.create_task(replica.process_batch([_row("in the engine")]))
        await _turns()
        assert replica.engine.busy_rows == 1
        await replica.follower.apply(1, {"paused": "wait"})
        assert replica.rows == 1, "pause() returned after the row in the engine finished"
        assert (await call)[0]["generated_text"] == "in the engine"

    asyncio.run(scenario())


def test_pause_in_keep_mode_freezes_the_rows_in_the_engine():
    async def scenario():
        replica = _echo(delay_s=0.05)
        call = asyncio.create_task(replica.process_batch([_row("frozen")]))
        await _turns()
        await replica.follower.apply(1, {"paused": "keep"})
        await asyncio.sleep(0.3)
        assert not call.done() and replica.rows == 0
        await replica.follower.apply(2, {"paused": None})
        assert (await asyncio.wait_for(call, 5))[0]["generated_text"] == "frozen"

    asyncio.run(scenario())


def test_an_old_state_version_is_not_applied_after_a_newer_one():
    async def scenario():
        replica = _echo()
        await replica.follower.apply(3, {"paused": None})
        await replica.follower.apply(2, {"paused": "wait"})  # late: a resume came after it
        assert replica.paused is None and replica.follower.version == 3

    asyncio.run(scenario())


def test_refusals_name_backend_and_call_and_change_nothing():
    from contract2_adapter import ShoutDeployment
    from relayllm_shout.plugin import ShoutEngine, ShoutOptions

    async def scenario():
        # An engine that implements no capability refuses every call, and still serves; so
        # does a contract-2 adapter (through the wrapper) that overrides no hook.
        for shout in (
            Replica(ShoutEngine, ShoutOptions(), {"name": "loud"}),
            ShoutDeployment(ShoutOptions(), {"name": "loud"}),
        ):
            refusals = await shout.control_refusals()
            assert set(refusals["refused"]) == set(CONTROL_CALLS)
            with pytest.raises(ControlRefusedError) as refused:
                await shout.control("tokenize", "a b")
            assert str(refused.value).startswith(
                f"backend {shout.backend_name!r} cannot do the control call 'tokenize' "
                "(deployment 'loud')"
            )
        echo = _echo()
        refused_by_echo = (await echo.control_refusals())["refused"]
        assert set(refused_by_echo) == {"sleep", "wake_up", "reset_prefix_cache"}
        with pytest.raises(ControlRefusedError, match="'echo' cannot do the control call 'sleep'"):
            await echo.control("sleep", 1)
        assert echo.paused is None and echo.follower.version == 0
        assert await echo.control("is_paused") is False
        ids = await echo.control("tokenize", "héllo wörld")
        assert await echo.control("detokenize", ids) == "héllo wörld"

    asyncio.run(scenario())


def test_an_adapter_loaded_at_runtime_answers_the_rows_that_name_it(tmp_path):
    async def scenario():
        replica = _echo()
        with pytest.raises(FileNotFoundError):
            await replica.control("load_adapter", "tiny", str(tmp_path / "missing"))
        assert await replica.control("adapters") == {}, "a failed load records nothing"
        await replica.control("load_adapter", "tiny", str(tmp_path))
        assert await replica.control("adapters") == {"tiny": str(tmp_path)}
        rows = [{**_row("a b"), "model": "tiny"}, _row("a b")]
        answers = [r["generated_text"] for r in await replica.process_batch(rows)]
        assert answers == ["<tiny> a b", "a b"]
        # A replica that starts later gets the deployment's adapters from the state.
        late = _echo()
        await late.follower.apply(1, {"paused": None, "adapters": {"tiny": str(tmp_path)}})
        assert await late.control("adapters") == {"tiny": str(tmp_path)}
        await late.follower.apply(2, {"paused": None, "adapters": {}})
        assert await late.control("adapters") == {}

    asyncio.run(scenario())


def test_the_refusal_error_survives_pickling_between_processes():
    error = ControlRefusedError("openai", "sleep", "no such API", "remote")
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and (again.backend, again.call) == ("openai", "sleep")
    assert "nothing was changed" in str(again)


def test_a_paused_http_front_answers_503_with_retry_after():
    from starlette.requests import Request

    async def scenario():
        replica = _echo(deployment={"http": {}})

        async def app(scope, receive, send):
            response = await replica.http_front(Request(scope, receive))
            await response(scope, receive, send)

        http = importlib.import_module(
            openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0]
        )
        body = {"model": "unit", "prompt": "hello", "max_tokens": 2}
        async with http.AsyncClient(transport=http.ASGITransport(app=app)) as client:
            ok = await client.post("http://front/v1/completions", json=body)
            assert ok.status_code == 200
            await replica.follower.apply(1, {"paused": "wait"})
            for stream in (False, True):
                paused = await client.post(
                    "http://front/v1/completions", json={**body, "stream": stream}
                )
                assert paused.status_code == 503
                assert paused.headers["retry-after"] == "5"
                assert "paused" in paused.json()["error"]["message"]
            await replica.follower.apply(2, {"paused": None})
            assert (await client.post("http://front/v1/completions", json=body)).status_code == 200

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "args, message",
    [
        (["detokenize", "1", "x"], "detokenize takes token ids"),
        (["sleep", "deep"], "sleep takes at most one LEVEL"),
        (["tokenize"], "tokenize takes one TEXT"),
        (["is_paused", "extra"], "is_paused takes no arguments"),
        (["load_adapter", "only-a-name"], "load_adapter takes NAME PATH"),
        (["update_weights", "/ckpt"], "update_weights takes SOURCE VERSION"),
    ],
)
def test_control_command_checks_its_arguments_before_touching_a_cluster(args, message):
    from click.testing import CliRunner

    from relayllm.cli import main

    done = CliRunner().invoke(main, ["control", "some-name", *args])
    assert done.exit_code == 2 and message in done.output, done.output


def test_control_commands_have_help():
    from click.testing import CliRunner

    from relayllm.cli import main

    for command in ("pause", "resume", "control"):
        done = CliRunner().invoke(main, [command, "--help"])
        assert done.exit_code == 0 and "--address" in done.output, command
