"""The stage's gRPC transport caps a message at 4 MiB: a bigger call falls back to Serve's
actor calls and every row is still answered, once and in order."""

import pytest
import ray
from support import SHARED_ECHO

import relayllm
from relayllm import ProcessorConfig, build_processor

pytestmark = pytest.mark.usefixtures("ray_session")

ECHO = SHARED_ECHO  # the `echo` fixture's deployment: the session's, shared


def test_a_call_larger_than_grpc_allows_is_resent_over_actor_calls(echo):
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    big = "word " * (1_100_000)  # 5.5 MB: over gRPC's 4 MiB on its own
    rows = [{"id": i, "prompt": big if i == 3 else f"row {i}"} for i in range(8)]
    proc = build_processor(
        ProcessorConfig(deployment=ECHO["name"], task="completion", batch_size=4, max_retries=0)
    )
    out = proc(ray.data.from_items(rows, override_num_blocks=1)).take_all()
    assert [r["id"] for r in out] == list(range(8))
    assert [r["error"] for r in out] == [None] * 8, "max_retries=0: the fallback is not a retry"
    assert out[3]["generated_text"] == big.strip()
    assert all(r["generated_text"] == f"row {r['id']}" for r in out if r["id"] != 3)


def test_the_stage_really_falls_back_and_only_on_the_call_too_large_for_grpc(echo):
    """In-process stage, so its transport state can be read: a small call keeps gRPC, the
    5.5 MB call switches to actor calls (the test above would pass on either transport)."""
    import asyncio

    import pyarrow as pa

    from relayllm.stage.udf import ServeStage

    config = ProcessorConfig(deployment=ECHO["name"], task="completion", max_retries=0)
    stage = ServeStage(config, "fallback-test")
    big = "word " * 1_100_000

    async def run() -> None:
        small = await stage(pa.table({"prompt": ["a", "b"]}))
        assert small.column("error").to_pylist() == [None, None]
        assert stage.transport.grpc, "a small call must stay on the gRPC transport"
        out = await stage(pa.table({"prompt": [big]}))
        assert out.column("error").to_pylist() == [None]
        assert not stage.transport.grpc, "the 5.5 MB call did not fall back to actor calls"

    asyncio.run(run())


def test_the_transport_is_a_config_field_whose_default_is_the_environment(echo, monkeypatch):
    from relayllm.stage.udf import ServeStage

    config = ProcessorConfig(deployment=ECHO["name"], task="completion")
    assert config.transport == "grpc"
    monkeypatch.setenv("RELAYLLM_SERVE_TRANSPORT", "actor")
    actor = ProcessorConfig(deployment=ECHO["name"], task="completion")
    assert actor.transport == "actor"
    assert ProcessorConfig(deployment="d", transport="grpc").transport == "grpc"
    with pytest.raises(relayllm.ConfigError, match="transport"):
        ProcessorConfig(deployment="d", transport="http")
    # The stage follows the config it is given, whatever its own process's environment says.
    monkeypatch.delenv("RELAYLLM_SERVE_TRANSPORT")
    assert ServeStage(actor, "p").transport.grpc is False
    assert ServeStage(config, "p").transport.grpc is True
    rows = [{"id": i, "prompt": f"row {i}"} for i in range(6)]
    out = build_processor(actor)(ray.data.from_items(rows, override_num_blocks=1)).take_all()
    assert sorted(r["generated_text"] for r in out) == sorted(f"row {i}" for i in range(6))
