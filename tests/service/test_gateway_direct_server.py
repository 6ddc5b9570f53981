"""The direct server (``relayllm/http/server.py``, the gateway's own) on loopback, without
Ray: an app's routes under the server's path prefix, and a fixed port that another process
holds (waited for while the holder may be the gateway's previous replica, then refused naming
the port). The flow control it exists for is tested end to end in test_batch_service.py."""

import asyncio
import json
import socket
import urllib.error
import urllib.request

import pytest

pytest.importorskip("uvicorn")

from starlette.routing import Route

from relayllm.http import server
from relayllm.http.app import HttpApp, route_path
from relayllm.http.errors import json_response
from relayllm.http.server import DirectServer, ServerError


async def where(request):
    """What a route set sees of a request."""
    return json_response({"path": route_path(request), "method": request.method})


APP = HttpApp([Route("/v1/files", where, methods=["GET"]), Route("/v1/batches", where)])


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


def test_routes_are_the_apps_under_its_prefix_and_others_answer_404():
    async def main():
        server = DirectServer(APP, "127.0.0.1", 0, "/api")
        await server.start()
        try:
            assert server.url == f"http://127.0.0.1:{server.port}/api/v1"
            inside = await asyncio.to_thread(get, f"{server.url}/files?limit=2")
            slash = await asyncio.to_thread(get, f"{server.url}/files/")
            outside = await asyncio.to_thread(get, f"http://127.0.0.1:{server.port}/v1/files")
            unknown = await asyncio.to_thread(get, f"{server.url}/nowhere")
        finally:
            await server.stop()
        return inside, slash, outside, unknown

    inside, slash, outside, unknown = asyncio.run(main())
    assert inside == slash == (200, {"path": "/v1/files", "method": "GET"})
    assert outside[0] == 404 and "/api" in outside[1]["error"]["message"], outside
    assert unknown[0] == 404 and unknown[1]["error"]["code"] == "not_found", unknown
    assert "/v1/files" in unknown[1]["error"]["message"]  # the routes it has


def test_a_port_held_by_another_process_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(server, "BIND_WAIT_S", 0.3)
    holder, port = held_port()
    with holder, pytest.raises(ServerError) as refused:
        asyncio.run(DirectServer(APP, "127.0.0.1", port, hint="set --direct-port").start())
    assert f"127.0.0.1:{port}" in str(refused.value) and "--direct-port" in str(refused.value)


def test_a_port_released_while_it_waits_is_taken():
    """A restarted or replaced gateway replica may start while the old one still closes."""
    holder, port = held_port()

    async def main():
        direct = DirectServer(APP, "127.0.0.1", port)
        starting = asyncio.create_task(direct.start())
        await asyncio.sleep(0.8)
        assert not starting.done()  # still waiting for the port
        holder.close()
        await asyncio.wait_for(starting, timeout=server.BIND_WAIT_S)
        try:
            return direct.port, await asyncio.to_thread(get, f"{direct.url}/batches")
        finally:
            await direct.stop()

    assert asyncio.run(main()) == (port, (200, {"path": "/v1/batches", "method": "GET"}))
