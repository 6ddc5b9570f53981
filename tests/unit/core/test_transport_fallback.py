"""Which transport errors make the stage fall back from gRPC to Serve's actor calls (the
fallback itself on a real cluster: tests/core/test_transport_fallback_on_ray.py)."""

from relayllm.stage.transport import is_grpc_error


def test_only_grpc_transport_errors_trigger_the_fallback():
    import grpc

    too_large = grpc.aio.AioRpcError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details="Received message larger than max",
    )
    assert is_grpc_error(too_large)
    assert not is_grpc_error(TimeoutError("no answer"))
    assert not is_grpc_error(ConnectionError("injected failure of call 1"))
