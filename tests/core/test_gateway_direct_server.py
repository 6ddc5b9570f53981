"""The gateway's own HTTP server (``batch/service/direct.py``) on loopback, without Ray: its
routes under the gateway's path prefix, and a fixed port that another process holds (waited
for while the holder may be the gateway's previous replica, then refused naming the port).
The flow control it exists for is tested end to end in test_batch_service.py."""

import asyncio
import json
import socket
import urllib.error
import urllib.request

import pytest

pytest.importorskip("uvicorn")

from starlette.responses import JSONResponse

from relayllm.batch.service import direct
from relayllm.batch.service.direct import DirectServer
from relayllm.batch.service.errors import ServiceError
from relayllm.batch.service.gateway import _path


async def where(request):
    """What the gateway's router sees of a request."""
    return JSONResponse({"path": _path(request), "method": request.method})


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def held_port():
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder, holder.getsockname()[1]


def test_routes_are_the_gateways_under_its_prefix_and_others_answer_404():
    async def main():
        server = DirectServer(where, "127.0.0.1", 0, "/api")
        await server.start()
        try:
            assert server.url == f"http://127.0.0.1:{server.port}/api/v1"
            inside = await asyncio.to_thread(get, f"{server.url}/files?limit=2")
            outside = await asyncio.to_thread(get, f"http://127.0.0.1:{server.port}/v1/files")
        finally:
            await server.stop()
        return inside, outside

    inside, outside = asyncio.run(main())
    assert inside == (200, {"path": "/v1/files", "method": "GET"})
    assert outside[0] == 404 and "/api" in outside[1]["error"]["message"], outside


def test_a_port_held_by_another_process_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(direct, "BIND_WAIT_S", 0.3)
    holder, port = held_port()
    with holder, pytest.raises(ServiceError) as refused:
        asyncio.run(DirectServer(where, "127.0.0.1", port).start())
    assert f"127.0.0.1:{port}" in str(refused.value) and "--direct-port" in str(refused.value)


def test_a_port_released_while_it_waits_is_taken():
    """A restarted or replaced gateway replica may start while the old one still closes."""
    holder, port = held_port()

    async def main():
        server = DirectServer(where, "127.0.0.1", port)
        starting = asyncio.create_task(server.start())
        await asyncio.sleep(0.8)
        assert not starting.done()  # still waiting for the port
        holder.close()
        await asyncio.wait_for(starting, timeout=direct.BIND_WAIT_S)
        try:
            return server.port, await asyncio.to_thread(get, f"{server.url}/batches")
        finally:
            await server.stop()

    assert asyncio.run(main()) == (port, (200, {"path": "/v1/batches", "method": "GET"}))
