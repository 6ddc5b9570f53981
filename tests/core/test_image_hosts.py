"""Which hosts a chat row's http(s) image may name (``ImageLimits.remote_hosts``,
``ProcessorSettings.remote_image_hosts``; the batch service allows none by default), against
a real image server on loopback that counts what it is asked: a refused URL, or a redirect to
a host not allowed, is never fetched. No cluster; here because the unit suite has no
sockets."""

import asyncio
import base64
import io

import pytest
from PIL import Image

from relayllm.stage.images import ImageError, ImageLimits, prepare_pending, read_image_bytes


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


GOOD = png(7, 5)


def chat(url: str) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]


@pytest.fixture
def loopback():
    """An image server on loopback that counts what it is asked; ``/hop`` redirects to the
    same server under the name ``localhost``."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            if self.path == "/hop":
                self.send_response(302)
                self.send_header("Location", f"http://localhost:{port}/cat.png")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            self.wfile.write(GOOD)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{port}", asked
    httpd.shutdown()


def test_remote_image_hosts_allow_only_their_hosts_and_refused_ones_are_never_asked(loopback):
    base, asked = loopback
    assert read_image_bytes(f"{base}/cat.png", ImageLimits()) == GOOD  # None: any host
    assert read_image_bytes(f"{base}/cat.png", ImageLimits(remote_hosts=("127.0.0.1",))) == GOOD
    assert asked == ["/cat.png", "/cat.png"]
    with pytest.raises(ImageError, match="remote images are not allowed here"):
        read_image_bytes(f"{base}/cat.png", ImageLimits(remote_hosts=()))
    with pytest.raises(ImageError, match=r"images from http://127\.0\.0\.1:\d+ are not allowed"):
        read_image_bytes(f"{base}/cat.png", ImageLimits(remote_hosts=("example.org",)))
    assert len(asked) == 2  # the refused URLs were never fetched
    # an allowed host redirecting to one that is not: the redirect is not followed
    with pytest.raises(ImageError, match="localhost"):
        read_image_bytes(f"{base}/hop", ImageLimits(remote_hosts=("127.0.0.1",)))
    assert asked == ["/cat.png", "/cat.png", "/hop"]
    assert read_image_bytes(f"{base}/hop", ImageLimits(remote_hosts=("127.0.0.1", "LOCALHOST")))


def test_the_stage_fails_only_the_rows_whose_image_host_is_not_allowed(loopback):
    base, asked = loopback
    data = "data:image/png;base64," + base64.b64encode(GOOD).decode()
    pending = [
        (0, {"task": "chat", "messages": chat(f"{base}/cat.png")}),
        (1, {"task": "chat", "messages": chat(data)}),
    ]
    results: list = [{}, {}]
    kept = asyncio.run(prepare_pending(pending, results, False, []))
    assert [i for i, _ in kept] == [1]
    assert "remote images are not allowed here" in results[0]["error"]
    assert asked == []
