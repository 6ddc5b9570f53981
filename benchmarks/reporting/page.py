"""docs/benchmarks.md, put together: the questions in order, each from its own module, then
the result files no question reads, the GPU context and the commands that reproduce them.

    python benchmarks/report.py            # the page and its charts (docs/img/*.png)
    python benchmarks/report.py --check    # exit 1 if the page is not what the results make
"""

from __future__ import annotations

import sys
from typing import Any

from reporting import (
    batch_file,
    batch_service,
    batch_vs_vllm,
    engine,
    fair_share,
    gateway_memory,
    ledger,
    online_batch,
    overhead,
    pass_cost,
    routing,
    scaleout,
    userpath,
    vs_ray_data_llm,
)
from reporting.common import CHARTS, DOCS, load_results, machine, provenance, render

PAGE = DOCS / "benchmarks.md"

#: (the results file a question needs, its heading when not run yet, the module's section)
SECTIONS = [
    ("overhead", "1. Framework overhead", overhead.section),
    ("overhead-probe", "1b. Flatness past the ramp-up", overhead.probe_section),
    ("userpath", "1c. The path users write", userpath.section),
    ("scaleout", "2. Scale-out", scaleout.section),
    ("engine", "3a. Engine efficiency", engine.section),
    ("pass_cost", "3c. What a small pass costs", pass_cost.section),
    ("vs_ray_data_llm", "7. Head-to-head with ray.data.llm", vs_ray_data_llm.section),
    ("online_batch-jobid-1", "9. Online and batch traffic on one engine", online_batch.section),
    ("batch_file", "10. relayllm batch at scale", batch_file.section),
    ("batch_vs_vllm", "10b. relayllm batch against vLLM's run_batch", batch_vs_vllm.section),
    ("batch_service", "11. The Batch API service at scale", batch_service.section),
    ("gateway_memory", "11b. The gateway's memory on a large file", gateway_memory.section),
    ("routing", "12. Replicas and routing", routing.section),
    ("routing-vllm", "12b. Replicas and routing on the demo model", routing.vllm_section),
    ("fair_share", "13. Weighted fair share between projects", fair_share.section),
    ("ledger", "14. The usage ledger's overhead", ledger.section),
]

#: Result files a question reads besides the one it is listed under.
ALSO_READ = ("engine-actors", "userpath-tasks", "online_batch-")


def _read_by_a_question(name: str) -> bool:
    return any(name == key for key, _, _ in SECTIONS) or name.startswith(ALSO_READ)


def _machines(results: dict[str, dict[str, Any]]) -> str:
    by_machine: dict[str, list[str]] = {}
    for name, data in results.items():
        by_machine.setdefault(machine(data), []).append(name)
    return "\n".join(
        f"- {description}: {', '.join(names)}" for description, names in sorted(by_machine.items())
    )


def _others(results: dict[str, dict[str, Any]]) -> list[str]:
    others = [name for name in results if not _read_by_a_question(name)]
    if not others:
        return []
    return (
        ["## Other result files", ""]
        + [f"- {provenance(name, results[name])}" for name in others]
        + [""]
    )


def build() -> str:
    results = load_results()
    out = render("page", machines=_machines(results)) + [""]
    for name, title, section in SECTIONS:
        if name in results:
            out += section(results)
        else:
            out += [f"## {title}", "", "Not run yet: no results file in benchmarks/results/.", ""]
    out += _others(results)
    commands = "\n".join(
        f"{data.get('command', f'python benchmarks/{name}.py')}   # -> results/{name}.json"
        for name, data in results.items()
    )
    out += render("reproduce", commands=commands)
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str]) -> int:
    if "--check" in argv:
        drawing = CHARTS["draw"]
        CHARTS["draw"] = False  # the text only: charts are binary and drawn where they are run
        try:
            stale = PAGE.read_text() != build()
        finally:
            CHARTS["draw"] = drawing
        if stale:
            print(f"{PAGE} is stale: run python benchmarks/report.py")
        return int(stale)
    PAGE.write_text(build())
    print(f"wrote {PAGE} and its charts in {CHARTS['dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
