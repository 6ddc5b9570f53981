"""10k rows, 10% bad in different ways: exact counts, every error says what was wrong."""

import pytest
import ray

from relayllm import ProcessorConfig, build_processor

# kind -> (a bad row's fields, words its error must contain)
BAD = {
    "missing": ({}, "no 'messages'"),
    "wrong-type": ({"messages": 42}, "non-empty list"),
    "empty": ({"messages": []}, "non-empty list"),
    "bad-role": ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
    "no-content": ({"messages": [{"role": "user"}]}, "content"),
    "not-utf8": ({"messages": [{"role": "user", "content": "bad \ud800 text"}]}, "UTF-8"),
    "bad-params": ({"sampling_params": {"temperature": -1}}, "temperature"),
    "engine-refuses": ({"messages": [{"role": "user", "content": "please FAILME now"}]}, "refused"),
}
N = 10_000


def _dataset():
    kinds = list(BAD)
    rows, expected = [], {}
    for i in range(N):
        row = {"id": i, "messages": [{"role": "user", "content": f"question {i}"}]}
        if i % 10 == 5:  # 10% bad, every kind in every block
            kind = kinds[(i // 10) % len(kinds)]
            fields, _ = BAD[kind]
            row = {"id": i} if kind == "missing" else {**row, **fields}
            expected[i] = kind
        if i % 1000 == 7:  # huge but valid rows travel too
            row["messages"] = [{"role": "user", "content": "word " * 50_000}]
        rows.append(row)
    # One block per 1000 rows; every block holds every kind of bad value.
    return ray.data.from_items(rows, override_num_blocks=10), expected


#: The `echo` fixture's deployment: rows holding the marker fail.
ECHO = {"name": "scale", "options": {"fail_marker": "FAILME"}}


def test_record_mode_exact_counts(echo):
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    ds, expected = _dataset()
    out = build_processor(ProcessorConfig(deployment="scale", batch_size=64))(ds).take_all()
    assert len(out) == N and [r["id"] for r in out] == list(range(N))
    failed = {r["id"]: r["error"] for r in out if r["error"]}
    assert set(failed) == set(expected) and len(failed) == 1000
    for i, kind in expected.items():
        assert BAD[kind][1] in failed[i], (kind, failed[i])
    good = [r for r in out if not r["error"]]
    assert len(good) == 9000 and all(r["generated_text"] for r in good)


def test_raise_mode_fails_fast_naming_the_bad_row(echo):
    rows = [{"id": f"row-{i}", "prompt": f"ok {i}"} for i in range(2000)]
    rows[1234]["prompt"] = ""
    proc = build_processor(
        ProcessorConfig(deployment="scale", task="completion", on_error="raise", id_column="id")
    )
    with pytest.raises(Exception, match="id='row-1234'.*deployment 'scale'"):
        proc(ray.data.from_items(rows, override_num_blocks=1)).take_all()
