import threading
import time

import pytest


class BackgroundJob:
    """A processor running over rows in a thread, so a test can break things mid-job."""

    def __init__(self, processor, rows, blocks):
        import ray

        self.result: list[dict] | None = None
        self._thread = threading.Thread(
            target=lambda: setattr(
                self,
                "result",
                processor(ray.data.from_items(rows, override_num_blocks=blocks)).take_all(),
            )
        )
        self._thread.start()

    def wait_until_replica_computed(self, handle, rows: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while handle.info.remote().result(timeout_s=30)["rows"] < rows:
            assert time.monotonic() < deadline, "the job did not get going"
            time.sleep(0.2)

    def finish(self, timeout_s: float) -> list[dict]:
        self._thread.join(timeout=timeout_s)
        assert not self._thread.is_alive(), "the job hung"
        assert self.result is not None, "the job failed"
        return self.result


@pytest.fixture
def background_job(ray_session):
    return BackgroundJob
