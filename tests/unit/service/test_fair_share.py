"""Weighted fair share of the runner's slots without Ray: projects of weight 2 and 1 get their
turns 2:1 in every window of three, and their lines 2:1 when their turns write unequal lines
(counted in lines, not turns); within a project batches take turns as before, a project that
joins late starts within one turn, and the runner's slot rule follows the weights of the
quotas file."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

from relayllm_service.tenancy.fair import FairShare, hold_back
from relayllm_service.tenancy.quotas import Quota

CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Batch:
    id: str
    project: str


def turns_of(share: FairShare, waiting: list[Batch], n: int, joins=None) -> list[Batch]:
    """``n`` turns of one slot, each ending with its batch unfinished (back to waiting);
    ``joins``: turn number -> a batch that arrives before it."""
    turns: dict[str, int] = {}
    given = []
    for tick in range(1, n + 1):
        if joins and tick in joins:
            waiting.append(joins[tick])
        chosen = share.pick(waiting, turns)
        share.granted(chosen.project)
        turns[chosen.id] = tick
        given.append(chosen)
    return given


def test_weights_two_to_one_share_every_window_of_three_turns():
    weights = {"heavy": 2.0, "light": 1.0}
    share = FairShare(weights.__getitem__)
    waiting = [Batch(f"{p}{i}", p) for p in ("light", "heavy") for i in range(3)]
    given = turns_of(share, waiting, 30)
    assert Counter(b.project for b in given) == {"heavy": 20, "light": 10}
    for start in range(0, 30, 3):
        window = Counter(b.project for b in given[start : start + 3])
        assert window == {"heavy": 2, "light": 1}, (start, given)
    heavy = [b.id for b in given if b.project == "heavy"]
    assert heavy[:6] == ["heavy0", "heavy1", "heavy2"] * 2  # within a project: turns


def test_turns_of_unequal_lines_still_share_lines_two_to_one():
    """What the echo benchmark saw: the weight-2 project's turns wrote one block (1,000
    lines) each, the other's ten. Counted in turns that is 0.2:1; counted in lines each
    project stays within one turn of its share, at every turn."""
    weights = {"heavy": 2.0, "light": 1.0}
    per_turn = {"heavy": 1_000, "light": 10_000}
    share = FairShare(weights.__getitem__)
    waiting = [Batch("h", "heavy"), Batch("l", "light")]
    turns: dict[str, int] = {}
    lines = Counter[str]()
    for tick in range(1, 601):
        chosen = share.pick(waiting, turns)
        share.granted(chosen.project, chosen.id)
        turns[chosen.id] = tick
        share.ended(chosen.id, per_turn[chosen.project])
        lines[chosen.project] += per_turn[chosen.project]
        # Stride's bound: the passes (lines / weight) differ by at most one turn's charge.
        assert abs(lines["heavy"] / 2 - lines["light"]) <= 10_000, (tick, lines)
    assert abs(lines["heavy"] / lines["light"] - 2.0) <= 0.1, lines


def test_a_turn_that_never_ran_stays_charged():
    """A turn whose claim another runner held wrote nothing but still counts as an average
    turn: its project does not get every next slot while the claim is held."""
    share = FairShare(lambda project: 1.0)
    waiting = [Batch("a", "a"), Batch("b", "b")]
    turns: dict[str, int] = {}
    given = []
    for tick in range(1, 7):
        chosen = share.pick(waiting, turns)
        share.granted(chosen.project, chosen.id)
        turns[chosen.id] = tick
        share.ended(chosen.id, None if chosen.id == "a" else 1)
        given.append(chosen.id)
    assert given == ["a", "b", "a", "b", "a", "b"]


def test_equal_weights_alternate_projects_not_batches():
    share = FairShare(lambda project: 1.0)
    waiting = [Batch("a0", "a"), Batch("a1", "a"), Batch("a2", "a"), Batch("b0", "b")]
    given = [b.id for b in turns_of(share, waiting, 6)]
    assert given == ["a0", "b0", "a1", "b0", "a2", "b0"]


def test_a_light_project_joining_late_starts_within_one_turn():
    weights = {"heavy": 10.0, "other": 10.0, "light": 1.0}
    share = FairShare(weights.__getitem__)
    waiting = [Batch("h", "heavy"), Batch("o", "other")]
    given = turns_of(share, waiting, 40, joins={31: Batch("small", "light")})
    assert given[30].id == "small"  # the first free slot after it arrived
    assert "small" not in [b.id for b in given[31:40]]  # no catching up on its absence


def test_a_project_away_rejoins_at_the_others_pass():
    share = FairShare(lambda project: 1.0)
    turns_of(share, [Batch("a", "a")], 50)
    share.keep_only({"b"})  # a's batches finished
    given = [b.id for b in turns_of(share, [Batch("a2", "a"), Batch("b", "b")], 4)]
    assert sorted(given) == ["a2", "a2", "b", "b"]


def test_the_runners_slots_follow_the_quotas_weights(service):
    from relayllm_service.runner.loop import BatchRunner

    settings, store, storage = service
    quotas = {"alpha": Quota(weight=2), "beta": Quota()}
    runner = object.__new__(BatchRunner)  # no loop thread: _start_due driven by hand
    runner.settings = settings.model_copy(update={"max_batches": 1, "quotas": quotas})
    runner.store, runner.active, runner.turns, runner._tick = store, {}, {}, 0
    runner.fair = FairShare(lambda p: quotas[p].weight)
    started: list[str] = []
    runner._run = started.append  # a turn that ends at once, the batch unfinished
    owner = {}
    for project in ("beta", "alpha", "beta", "alpha"):
        data = b'{"custom_id": "r", "method": "POST", "url": "/v1/chat/completions"}\n'
        record = store.add_file(project, filename="in.jsonl", purpose="batch", bytes=len(data))
        storage.put(record.id, [data])
        owner[store.create_batch(project, input_file_id=record.id, endpoint=CHAT).id] = project
    for _ in range(9):
        runner._start_due()
        for thread in runner.active.values():
            thread.join()
    assert Counter(owner[b] for b in started) == {"alpha": 6, "beta": 3}
    assert owner[started[0]] == "beta"  # equal passes at first: the oldest batch


def test_a_turn_runs_its_projects_weight_in_lines():
    weights = {"heavy": 2.0, "light": 1.0, "half": 0.5, "tiny": 0.0001}
    share = FairShare(weights.__getitem__, lines_per_weight=250)
    assert {p: share.turn_lines(p) for p in weights} == {
        "heavy": 500,
        "light": 250,
        "half": 125,
        "tiny": 1,  # a turn always runs a line
    }


def write_batch(path, n: int, bad: tuple[int, ...] = ()) -> None:
    """``n`` chat lines (``bad``: these line numbers are not JSON, bad at a glance)."""
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    with open(path, "w") as out:
        for number in range(1, n + 1):
            if number in bad:
                out.write("not json\n")
            else:
                line = {"custom_id": f"r{number}", "method": "POST", "url": CHAT, "body": body}
                out.write(json.dumps(line) + "\n")


def to_run(scan) -> list[int]:
    """The line numbers a run of ``scan`` sends, in order."""
    from relayllm.batch.scan import SKIP

    return [
        chunk.first_line + i
        for chunk in scan.chunks
        for i, key in enumerate(chunk.keys)
        if key != SKIP
    ]


def test_held_back_lines_are_neither_run_nor_lost_across_turns(tmp_path):
    """Turns of 7 lines over a 50-line file (blocks of 16): each turn's scan, after the
    work files of the turns before it, runs the next 7 undone lines in file order, so every
    line runs in exactly one turn, none redone, none skipped, a turn ending mid-block; the
    line bad at a glance is written by the first turn, not counted in its 7."""
    from relayllm.batch.scan import read_done, scan_batch_file

    source, out, err = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    write_batch(source, 50, bad=(3,))
    out.touch(), err.touch()
    runs: list[list[int]] = []
    while True:
        done = read_done(str(out), str(err), False)
        scan = scan_batch_file(str(source), 16, done, check_ids=False)
        total = scan.to_run
        held = hold_back(scan, 7)
        lines = to_run(scan)
        assert (len(lines), held, scan.to_run) == (min(7, total), total - len(lines), len(lines))
        if not lines:
            break
        with open(out, "a") as written:  # the turn's lines, as the runner writes them
            for number in lines:
                written.write(json.dumps({"custom_id": f"r{number}", "error": None}) + "\n")
        with open(err, "a") as written:
            for bad in scan.bad:
                written.write(json.dumps({"custom_id": None, "error": {"line": bad.line}}) + "\n")
        runs.append(lines)
        assert len(runs) < 20
    ran = [number for lines in runs for number in lines]
    assert ran == [n for n in range(1, 51) if n != 3]  # each once, in order
    assert [len(lines) for lines in runs] == [7] * 7
    assert runs[2] == [16, 17, 18, 19, 20, 21, 22]  # across a block's end


def test_the_runner_caps_a_turn_only_while_another_batch_waits(service):
    """The cap a turn reads when it starts: weight x turn_lines while a batch is left
    waiting, decided before the turns' threads start; none for a batch alone."""
    from relayllm_service.runner.loop import BatchRunner

    settings, store, storage = service
    quotas = {"alpha": Quota(weight=2), "beta": Quota()}
    runner = object.__new__(BatchRunner)  # no loop thread: _start_due driven by hand
    runner.settings = settings.model_copy(update={"max_batches": 1, "turn_lines": 300})
    runner.store, runner.active, runner.turns, runner._tick = store, {}, {}, 0
    runner.fair = FairShare(lambda p: quotas[p].weight, runner.settings.turn_lines)
    runner.contended = False
    owner: dict[str, str] = {}
    caps: list[tuple[str, int | None]] = []
    runner._run = lambda b: caps.append((owner[b], runner._turn_lines(owner[b])))
    ids = []
    for project in ("beta", "alpha"):
        data = b'{"custom_id": "r", "method": "POST", "url": "/v1/chat/completions"}\n'
        record = store.add_file(project, filename="in.jsonl", purpose="batch", bytes=len(data))
        storage.put(record.id, [data])
        ids.append(store.create_batch(project, input_file_id=record.id, endpoint=CHAT).id)
        owner[ids[-1]] = project
    for _ in range(3):
        runner._start_due()
        for thread in runner.active.values():
            thread.join()
    assert caps == [("beta", 300), ("alpha", 600), ("alpha", 600)]
    store.cancel_batch("alpha", ids[1])  # alpha's batch ends: beta's alone
    claim = store.claim(ids[1], "x")
    store.update(ids[1], claim, status="cancelled")
    runner._start_due()
    for thread in runner.active.values():
        thread.join()
    assert caps[-1] == ("beta", None)
