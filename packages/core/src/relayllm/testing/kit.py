"""The conformance kit: the tests every backend must pass, inherited in a few lines.

    from relayllm.testing import BackendConformanceTests

    class TestMyBackend(BackendConformanceTests):
        backend = "my-backend"
        distribution = "relayllm-my-backend"   # whose entry point registers it
        options = {"model": "..."}

Each test class deploys its engine once (class scope) and shares it between the tests. A test
may be overridden only to mark it ``xfail`` with a reason; :meth:`test_no_silent_overrides`
fails otherwise, and fails if a standard test was deleted (set to ``None``).
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from typing import Any, ClassVar

import pytest

import relayllm
from relayllm.plugin import NAME
from relayllm.plugin.manager import get_registry

#: Modules that ``import relayllm`` (and importing an adapter's plugin module) must not load.
HEAVY_MODULES = ("vllm", "sglang", "torch", "openai", "transformers")


class BackendConformanceTests:
    backend: ClassVar[str]
    #: Distribution whose ``relayllm`` entry point registers the backend (None: registered in
    #: code, like the echo backend).
    distribution: ClassVar[str | None] = None
    options: ClassVar[dict[str, Any]] = {}
    #: Extra DeploymentConfig fields (num_replicas, startup_timeout_s, ...).
    deployment_fields: ClassVar[dict[str, Any]] = {}
    supports_chat: ClassVar[bool] = True
    supports_completion: ClassVar[bool] = True
    supports_embedding: ClassVar[bool] = False
    sampling_params: ClassVar[dict[str, Any]] = {"max_tokens": 8, "temperature": 0.0}
    processor_fields: ClassVar[dict[str, Any]] = {"batch_size": 8}
    #: Set to a reason to skip every test that needs a running engine (e.g. no GPU here).
    skip_engine_reason: ClassVar[str | None] = None

    # -- fixtures ----------------------------------------------------------------------------

    @property
    def deployment_name(self) -> str:
        return f"kit-{self.backend}"

    def deployment_config(self) -> relayllm.DeploymentConfig:
        return relayllm.DeploymentConfig(
            name=self.deployment_name,
            backend=self.backend,
            options=self.options,
            **self.deployment_fields,
        )

    @pytest.fixture(scope="class")
    def ray_cluster(self):
        import ray

        if not ray.is_initialized():
            # "local": a cluster of the test's own, never one already running on the machine.
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield ray

    @pytest.fixture(scope="class")
    def deployment(self, ray_cluster):
        if self.skip_engine_reason:
            pytest.skip(self.skip_engine_reason)
        ref = relayllm.deploy(self.deployment_config())
        yield ref
        if any(r.name == ref.name for r in relayllm.list_deployments()):
            relayllm.shutdown(ref.name)

    def deployed(self) -> relayllm.DeploymentRef:
        """The kit's deployment, started again if an earlier test shut it down."""
        return relayllm.deploy(self.deployment_config())

    def processor(self, task: str = "chat", **fields: Any) -> relayllm.Processor:
        config = relayllm.ProcessorConfig(
            deployment=self.deployment_name,
            task=task,
            sampling_params=self.sampling_params,
            **{**self.processor_fields, **fields},
        )
        return relayllm.build_processor(config)

    def rows(self, n: int, task: str = "chat") -> list[dict[str, Any]]:
        """Row i asks with i+1 repetitions of a word, so input token counts grow with i."""
        out = []
        for i in range(n):
            text = "Say hello. " + " ".join(["apple"] * (i + 1))
            if task == "chat":
                out.append({"id": i, "messages": [{"role": "user", "content": text}]})
            elif task == "completion":
                out.append({"id": i, "prompt": text})
            else:
                out.append({"id": i, "input": text})
        return out

    def run(
        self, processor: relayllm.Processor, rows: list[dict[str, Any]], blocks: int | None = None
    ) -> list[dict[str, Any]]:
        import ray

        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        return processor(ray.data.from_items(rows, override_num_blocks=blocks)).take_all()

    # -- plugin contract (no engine) ---------------------------------------------------------

    def test_backend_discovered_through_entry_point(self):
        registry = get_registry()
        assert self.backend in registry, f"{self.backend!r} not in {registry.names()}"
        if self.distribution is None:
            return
        dist = importlib.metadata.distribution(self.distribution)
        points = [ep for ep in dist.entry_points if ep.group == NAME]
        assert points, f"{self.distribution} declares no entry point in group {NAME!r}"
        origin = registry.origin(self.backend) or ""
        assert any(ep.name in origin for ep in points), (
            f"{self.backend!r} was registered by {origin}, not by {self.distribution}"
        )

    def test_options_reject_unknown_keys(self):
        backend = get_registry().get(self.backend)
        backend.parse_options(self.options)  # the kit's own options are valid
        with pytest.raises(relayllm.ConfigError, match="no_such_option_xyz"):
            backend.parse_options({**self.options, "no_such_option_xyz": 1})

    def test_import_stays_light(self):
        modules = ["relayllm"]
        if self.distribution:
            dist = importlib.metadata.distribution(self.distribution)
            modules += [ep.value.split(":")[0] for ep in dist.entry_points if ep.group == NAME]
        code = (
            "import importlib, json, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(HEAVY_MODULES)!r}))))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [], f"importing {modules} loaded heavy modules"

    # -- with a running engine ---------------------------------------------------------------

    def test_health_and_info(self, deployment):
        handle = self.deployed().handle()
        assert handle.health.remote().result(timeout_s=120)["ok"] is True
        info = handle.info.remote().result(timeout_s=120)
        assert info["backend"] == self.backend
        assert info["replica_id"]

    def test_two_sequential_processors_share_one_deployment(self, deployment):
        import ray

        if not self.supports_chat:
            pytest.skip("backend does not serve chat")
        handle = self.deployed().handle()
        before = handle.info.remote().result(timeout_s=120)
        first, second = self.processor(), self.processor()
        rows = self.rows(12)

        def follow_up(row: dict[str, Any]) -> dict[str, Any]:
            return {"id": row["id"], "first_answer": row["generated_text"],
                    "messages": [{"role": "user", "content": "Shorter: " + (row["generated_text"] or "")}]}

        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        ds = first(ray.data.from_items(rows)).map(follow_up)
        out = second(ds).take_all()
        after = handle.info.remote().result(timeout_s=120)

        assert [r["id"] for r in out] == list(range(12))
        assert all(r["error"] is None for r in out), [r["error"] for r in out if r["error"]]
        assert all(isinstance(r["first_answer"], str) for r in out)
        assert after["replica_id"] == before["replica_id"], "a second replica or engine started"
        assert after["rows"] - before["rows"] == 24, "both processors' rows go to the one replica"

    def test_order_preserved_and_results_match_rows(self, deployment):
        task = "chat" if self.supports_chat else "completion"
        self.deployed()
        out = self.run(self.processor(task, batch_size=5, max_in_flight_batches=3), self.rows(40, task))
        assert [r["id"] for r in out] == list(range(40))
        assert all(r["error"] is None for r in out), [r["error"] for r in out if r["error"]]
        tokens = [r["num_input_tokens"] for r in out]
        # Longer prompts have more input tokens: a result placed on the wrong row breaks this.
        assert all(a < b for a, b in zip(tokens, tokens[1:])), tokens
        assert all(isinstance(r["generated_text"], str) for r in out)
        assert all(r["finish_reason"] in ("stop", "length") for r in out)

    def test_bad_rows_get_errors_and_the_rest_complete(self, deployment):
        if not self.supports_chat:
            pytest.skip("backend does not serve chat")
        self.deployed()
        rows = self.rows(30)
        bad = {3: "missing", 7: "not-a-list", 11: "no-role", 19: "empty", 23: "bad-role"}
        for i, kind in bad.items():
            if kind == "missing":
                rows[i] = {"id": i}
            elif kind == "not-a-list":
                rows[i]["messages"] = "hello"
            elif kind == "bad-role":
                rows[i]["messages"] = [{"role": "robot", "content": "hi"}]
            elif kind == "no-role":
                rows[i]["messages"] = [{"content": "hi"}]
            else:
                rows[i]["messages"] = []
        # One block, as when reading a file: Ray Data cannot concatenate blocks whose column
        # types differ (a string here, a list there), before any stage sees them.
        out = self.run(self.processor(), rows, blocks=1)
        assert len(out) == 30
        errors = {r["id"]: r["error"] for r in out if r["error"]}
        assert sorted(errors) == sorted(bad), errors
        assert "messages" in errors[3] and "role" in errors[11]
        assert all(isinstance(r["generated_text"], str) for r in out if r["id"] not in bad)

    def test_request_ids_unique_across_processors(self, deployment):
        task = "chat" if self.supports_chat else "completion"
        self.deployed()
        rows = self.rows(20, task)
        ids = [r["request_id"] for p in (self.processor(task), self.processor(task))
               for r in self.run(p, rows)]
        assert len(ids) == 40 and len(set(ids)) == 40

    def test_completion_task(self, deployment):
        if not self.supports_completion:
            pytest.skip("backend does not serve completion")
        self.deployed()
        out = self.run(self.processor("completion"), self.rows(6, "completion"))
        assert all(r["error"] is None and isinstance(r["generated_text"], str) for r in out), out
        assert all(r["num_generated_tokens"] > 0 for r in out)

    def test_embedding_task(self, deployment):
        if not self.supports_embedding:
            pytest.skip("backend does not serve embeddings")
        self.deployed()
        out = self.run(self.processor("embedding"), self.rows(6, "embedding"))
        assert all(r["error"] is None for r in out), out
        sizes = {len(r["embedding"]) for r in out}
        assert len(sizes) == 1 and sizes.pop() > 0

    def test_undeploy(self, deployment):
        ref = self.deployed()
        assert ref.name in [r.name for r in relayllm.list_deployments()]
        assert relayllm.shutdown(ref.name) == [ref.name]
        assert ref.name not in [r.name for r in relayllm.list_deployments()]
        with pytest.raises(relayllm.DeploymentNotFoundError, match=ref.name):
            relayllm.get_deployment(ref.name)

    # -- the guard ---------------------------------------------------------------------------

    def test_no_silent_overrides(self):
        """A standard test may be overridden only to xfail it, with a reason; never deleted."""
        for name in STANDARD_TESTS:
            mine = getattr(type(self), name, None)
            assert mine is not None, f"standard test {name} was deleted"
            if mine is getattr(BackendConformanceTests, name):
                continue
            marks = getattr(mine, "pytestmark", [])
            reasons = [m.kwargs.get("reason") or (m.args[1] if len(m.args) > 1 else None)
                       for m in marks if m.name == "xfail"]
            assert any(reasons), f"{name} is overridden without @pytest.mark.xfail(reason=...)"


STANDARD_TESTS = tuple(
    name for name in vars(BackendConformanceTests)
    if name.startswith("test_") and name != "test_no_silent_overrides"
)

__all__ = ["HEAVY_MODULES", "STANDARD_TESTS", "BackendConformanceTests"]
