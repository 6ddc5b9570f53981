"""Question 12: replicas and routing, affinity against Serve's default router and one replica:
on echo's simulated prefix cache (results/routing.json), then on the vLLM demo model's own
prefix cache (results/routing-vllm.json)."""

from __future__ import annotations

from typing import Any

from reporting.common import met, n, provenance, render, table, verdict


def _spread(figure: dict[str, float], fmt: str) -> str:
    return (
        f"{figure['median']:{fmt}} ({figure['min']:{fmt}}–{figure['max']:{fmt}})"
        if figure["min"] != figure["max"]
        else f"{figure['median']:{fmt}}"
    )


def _rows(entries: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (
            e["label"],
            e["runs"],
            e["errors"],
            n(e["prompt_tokens"]),
            _spread(e["prefilled_tokens"], ",.0f"),
            _spread(e["hit_rate"], ".3f"),
            _spread(e["max_over_mean"], ".2f"),
            " / ".join(str(v) for v in e["samples"][0]["rows_per_replica"]),
            _spread(e["seconds"], ".1f"),
        )
        for e in entries
    ]


def spread_of(entry: dict[str, Any]) -> float:
    """The worst run's most loaded replica over its least loaded one."""
    runs = [r["rows_per_replica"] for r in entry["samples"]]
    return max(r[-1] / r[0] if r[0] else float("inf") for r in runs)


HEAD = [
    "contender",
    "runs",
    "errors",
    "prompt tokens",
    "prefilled",
    "hit rate",
    "max/mean rows",
    "rows per replica (run 1)",
    "wall (s)",
]


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["routing"]
    settings = data["settings"]
    one, default, affinity = data["pipeline"]
    skew_default, skew_affinity = data["skewed"]
    head = HEAD
    prefilled = affinity["prefilled_tokens"]["median"] / one["prefilled_tokens"]["median"]
    prefilled_default = default["prefilled_tokens"]["median"] / one["prefilled_tokens"]["median"]
    rate = affinity["hit_rate"]["median"] / one["hit_rate"]["median"]
    bound = skew_affinity["max_over_mean"]["max"]
    verdicts = [
        f"- Prompt tokens prefilled, {affinity['label']}: {prefilled:.2f}x one replica's "
        f"(target at most 1.1x: {met(prefilled <= 1.1)}); {default['label']}: "
        f"{prefilled_default:.2f}x.",
        f"- Prefix-cache hit rate, {affinity['label']}: {rate:.2f}x one replica's (target at "
        f"least 0.9x: {met(rate >= 0.9)}).",
        f"- Rows per replica on the pipeline, {affinity['label']}: the most loaded "
        f"{affinity['max_over_mean']['max']:.2f}x the mean at worst, the most over the least "
        f"{spread_of(affinity):.1f}x (target within 1.25x of each other: "
        f"{met(spread_of(affinity) <= 1.25)}: {settings['rows']} keys hashed over "
        f"{settings['replicas']} replicas; the bound limits rows in flight, not a job's "
        "totals).",
        f"- Skewed job (a quarter of the rows share one key), {skew_affinity['label']}: the "
        f"most loaded replica {bound:.2f}x the mean at worst (target at most "
        f"{settings['load_bound']:g}x: {met(bound <= settings['load_bound'])}).",
        f"- Wall time, {affinity['label']}: {affinity['seconds']['median']:.1f} s against "
        f"{default['seconds']['median']:.1f} s with Serve's default router (target not worse, "
        "5% allowed: "
        f"{met(affinity['seconds']['median'] <= default['seconds']['median'] * 1.05)}; echo's "
        "engine time is per call, and a batch split by replica makes more, smaller calls).",
    ]
    return render(
        "routing",
        provenance=provenance("routing", data),
        replicas=settings["replicas"],
        rows=settings["rows"],
        doc_words=settings["doc_words"],
        block_words=settings["block_words"],
        delay_s=settings["delay_s"],
        batch_size=settings["batch_size"],
        skew_rows=settings["skew_rows"],
        pipeline=table(head, "lrrrrrrlr", _rows(data["pipeline"])),
        skewed=table(head, "lrrrrrrlr", _rows(data["skewed"])),
        verdicts="\n".join(verdicts),
    ) + [""]


def vllm_section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["routing-vllm"]
    settings = data["settings"]
    one, default, affinity = data["pipeline"]
    base_prefilled = one["prefilled_tokens"]["median"]
    base_rate = one["hit_rate"]["median"]
    prefilled = [r["prefilled_tokens"] / base_prefilled for r in affinity["samples"]]
    prefilled_default = default["prefilled_tokens"]["median"] / base_prefilled
    rates = [r["hit_rate"] / base_rate for r in affinity["samples"]] if base_rate else []
    spreads = [r["rows_per_replica"][-1] / r["rows_per_replica"][0] for r in affinity["samples"]]
    walls = [
        a["seconds"] / d["seconds"]
        for a, d in zip(affinity["samples"], default["samples"], strict=True)
    ]
    verdicts = [
        f"- Prompt tokens prefilled, {affinity['label']}: "
        f"{affinity['prefilled_tokens']['median'] / base_prefilled:.2f}x one replica's (target "
        f"at most 1.1x: {verdict(prefilled, 1.1, at_least=False)}); {default['label']}: "
        f"{prefilled_default:.2f}x.",
        f"- Prefix-cache hit rate, {affinity['label']}: "
        f"{affinity['hit_rate']['median'] / base_rate:.2f}x one replica's (target at least "
        f"0.9x: {verdict(rates, 0.9, at_least=True)}); {default['label']}: "
        f"{default['hit_rate']['median'] / base_rate:.2f}x.",
        f"- Rows per replica, {affinity['label']}: the most over the least {max(spreads):.2f}x "
        f"at worst (target within 1.25x: {verdict(spreads, 1.25, at_least=False)}).",
        f"- Wall time, {affinity['label']} over {default['label']} in the same round: "
        f"{', '.join(f'{w:.2f}x' for w in walls)} (target not worse, 5% allowed: "
        f"{verdict(walls, 1.05, at_least=False)}).",
    ]
    return render(
        "routing_vllm",
        provenance=provenance("routing-vllm", data),
        replicas=settings["replicas"],
        rows=settings["rows"],
        doc_words=settings["doc_words"],
        batch_size=settings["batch_size"],
        pipeline=table(HEAD, "lrrrrrrlr", _rows(data["pipeline"])),
        verdicts="\n".join(verdicts),
    ) + [""]
