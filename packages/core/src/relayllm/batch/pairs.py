"""Scoring lines (``/v1/score``, ``/v1/rerank``) in a batch file: one row per (query,
document) pair. The read task parses the line and emits its pairs (all in one block), the
stage sends them, and the driver gathers them into the line's response as they arrive."""

from __future__ import annotations

import json
from typing import IO, TYPE_CHECKING, Any

from relayllm.batch.format import BadLine, BatchRequest, parse_line
from relayllm.batch.output import error_line, gathered, response_line
from relayllm.rows import ERROR

if TYPE_CHECKING:
    from relayllm.batch.stop import StopCheck


def pair_rows(line: int, text: str) -> list[dict[str, Any]]:
    """A scoring line's rows: one per (query, document) pair; a bad line is one row that
    carries its error line (no query, so the stage sends nothing for it)."""
    request = parse_line(text, line)
    if isinstance(request, BadLine):
        message = error_line(request.line, request.custom_id, request.code, request.message)
        return [{"line": line, "pair": 0, "pairs": 1, "bad": json.dumps(message)}]
    return [
        {
            "line": line,
            "custom_id": request.custom_id,
            "pair": i,
            "pairs": len(request.pairs),
            "query": q,
            "document": d,
            "rerank": request.rerank,
            "top_n": request.top_n,
        }
        for i, (q, d) in enumerate(request.pairs)
    ]


def score_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("line", pa.int64()),
            ("custom_id", pa.string()),
            ("pair", pa.int64()),
            ("pairs", pa.int64()),
            ("query", pa.string()),
            ("document", pa.string()),
            ("rerank", pa.bool_()),
            ("top_n", pa.int64()),
            ("bad", pa.string()),
        ]
    )


class StopPairs:
    """``preprocess`` of a scoring group's pair rows in the stage actor, when the run can be
    stopped: a pair row after the stop carries ``skip`` and no query (nothing is sent for it),
    and :class:`ScoreWriter` leaves its whole line unwritten, so a resumed or expired run
    finds the line undone."""

    def __init__(self, stop: StopCheck) -> None:
        self.stop = stop

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        if self.stop():
            return {**row, "skip": True, "query": None}
        return {**row, "skip": False}


class ScoreWriter:
    """Gathers a scoring line's pair rows (they arrive in one block, in order) into its
    response; a pair that failed sends the whole line to the errors file; a line with a pair
    stopped before it was sent (``skip``) is written to neither file and counted as skipped."""

    def __init__(self, deployment: str, served: str) -> None:
        self.deployment, self.served = deployment, served
        self.pending: dict[int, list[dict[str, Any]]] = {}

    def __call__(
        self, rows: list[dict[str, Any]], output: IO[str], errors: IO[str]
    ) -> tuple[int, int, int]:
        ok = bad = skipped = 0
        for row in rows:
            if row.get("bad"):
                errors.write(row["bad"] + "\n")
                bad += 1
                continue
            pairs = self.pending.setdefault(row["line"], [])
            pairs.append(row)
            if len(pairs) < row["pairs"]:
                continue
            pairs = sorted(self.pending.pop(row["line"]), key=lambda r: r["pair"])
            if any(r.get("skip") for r in pairs):
                skipped += 1
                continue
            first = pairs[0]
            request = BatchRequest(
                first["line"],
                first["custom_id"],
                "score",
                None,
                {},
                None,
                [(r["query"], r["document"]) for r in pairs],
                bool(first["rerank"]),
                first["top_n"] or 0,
            )
            result = gathered(pairs)
            if result.get(ERROR):
                line = error_line(
                    request.line,
                    request.custom_id,
                    "engine_error",
                    f"deployment {self.deployment!r}: {result[ERROR]}",
                )
                errors.write(json.dumps(line, ensure_ascii=False) + "\n")
                bad += 1
            else:
                line = response_line(request, result, self.served)
                output.write(json.dumps(line, ensure_ascii=False) + "\n")
                ok += 1
        return ok, bad, skipped


__all__ = ["ScoreWriter", "StopPairs", "pair_rows", "score_schema"]
