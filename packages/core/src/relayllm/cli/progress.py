"""What a command shows while it works, from its first second: each phase (connecting,
deploying NAME, the engine starting with its elapsed time, "ready in N s"), then one progress
bar per step in rows (done/total, rows/s, tokens/s, ETA), and a warning when a step stops
moving, saying what it waits for.

On a terminal the bars are tqdm's (Ray Data's own bars are switched off); in a pipe or a log
file there are no bars: a plain line per step every ``RELAYLLM_PROGRESS_INTERVAL_S`` seconds.
A step's rows are read from Ray Data's executor (the rows its stage operator handed on), so
they move while the engine works, not only when a block reaches the output.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

from relayllm import env


def elapsed(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _columns() -> int:
    """The terminal's width; 100 where it reports none (a fresh pseudo-terminal says 0,
    and tqdm draws nothing at width 0)."""
    import shutil

    return shutil.get_terminal_size((100, 20)).columns


class Console:
    """Status lines and progress for one command, on stderr (stdout may carry rows)."""

    def __init__(
        self, stream: IO[str] | None = None, tty: bool | None = None, stall_s: float | None = None
    ) -> None:
        self._stream = stream
        self.tty = self.stream.isatty() if tty is None else tty
        self.stall_s = stall_s or env.STALL_WARNING_S.get()
        self.interval_s = env.PROGRESS_INTERVAL_S.get()
        self._lock = threading.Lock()

    @property
    def stream(self) -> IO[str]:
        """``sys.stderr`` when it is used, not when created: quiet mode replaces it."""
        return self._stream or sys.stderr

    def say(self, text: str) -> None:
        with self._lock:
            if self.tty:
                from tqdm import tqdm

                tqdm.write(f"relayllm: {text}", file=self.stream)
            else:
                self.stream.write(f"relayllm: {text}\n")
            self.stream.flush()

    @contextmanager
    def phase(self, doing: str, done: str | None = None) -> Iterator[None]:
        """``doing`` with a ticking elapsed time while the block runs; then ``done in N s``."""
        start = time.monotonic()
        stop = threading.Event()
        if self.tty:
            from tqdm import tqdm

            bar = tqdm(
                total=None,
                desc=f"relayllm: {doing}",
                bar_format="{desc} {elapsed}",
                file=self.stream,
                leave=False,
                ncols=_columns(),
            )

            def tick() -> None:
                while not stop.wait(0.5):
                    bar.refresh()
        else:
            self.say(f"{doing}...")
            bar = None

            def tick() -> None:
                while not stop.wait(self.interval_s):
                    self.say(f"{doing}... {elapsed(time.monotonic() - start)}")

        thread = threading.Thread(target=tick, daemon=True, name="relayllm-phase")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            if bar is not None:
                bar.close()
        if done:
            self.say(f"{done} in {elapsed(time.monotonic() - start)}")

    @contextmanager
    def steps(
        self, steps: list[tuple[str, str]], total: int | list[int] | None, sequential: bool = False
    ) -> Iterator[StepProgress]:
        """Progress of the steps (``(name, deployment)`` pairs) while they run: the stages of
        one dataset, or with ``sequential`` one dataset per step, run one after another
        (``total`` then lists each step's rows)."""
        progress = StepProgress(self, steps, total, sequential)
        progress.start()
        try:
            yield progress
        finally:
            progress.stop()


@dataclass
class _StepState:
    name: str
    deployment: str
    done: int = 0
    total: int | None = None
    active_tasks: int = 0
    queued_blocks: int = 0
    output_tokens: int = 0
    last_change: float = 0.0
    warned_at: float = 0.0
    #: When the step began to work (its stage's first task ran): its rates count from here,
    #: as the summary's count from the step's first row, not from the command's start.
    started: float | None = None

    def rates(self, now: float) -> tuple[float, float]:
        """(rows/s, output tokens/s) since the step began; (0, 0) before it has."""
        if self.started is None:
            return 0.0, 0.0
        spent = max(now - self.started, 1e-9)
        return self.done / spent, self.output_tokens / spent


class StepProgress:
    """The per-step display. Ray Data's executor thread feeds it (the callback below),
    the sink feeds it tokens, a thread of its own draws it."""

    def __init__(
        self,
        console: Console,
        steps: list[tuple[str, str]],
        total: int | list[int] | None,
        sequential: bool = False,
    ) -> None:
        self.console = console
        now = time.monotonic()
        totals = total if isinstance(total, list) else [total] * len(steps)
        self.states = [
            _StepState(n, d, total=t, last_change=now)
            for (n, d), t in zip(steps, totals, strict=True)
        ]
        self.total = total
        self.sequential = sequential
        self._executors: list[int] = []  # sequential: the datasets seen, in order
        self.start_time = now
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bars: list[Any] = []
        self._lock = threading.Lock()

    # -- fed by Ray Data's executor (its own thread) and by the sink (the main thread) ------

    def update_from_executor(self, executor: Any) -> None:
        from relayllm.stage.udf import STAGE_OPERATOR_NAMES

        stages = [
            (op, state)
            for op, state in executor._topology.items()  # Ray 2.60's layout
            if any(name in op.name for name in STAGE_OPERATOR_NAMES)
        ]
        states = self.states
        if self.sequential:  # the n-th dataset is the n-th step
            if id(executor) not in self._executors:
                self._executors.append(id(executor))
            states = states[self._executors.index(id(executor)) :][:1]
        with self._lock:
            for (op, state), step in zip(stages, states, strict=False):
                done = op.metrics.row_outputs_taken
                if done != step.done:
                    step.done, step.last_change = done, time.monotonic()
                if self.total is None:  # an estimate Ray Data refines as tasks finish
                    step.total = op.num_output_rows_total() or step.total
                step.active_tasks = op.num_active_tasks()
                step.queued_blocks = state.total_enqueued_input_blocks()
                if step.started is None and (step.active_tasks or step.done):
                    step.started = time.monotonic()

    def add_tokens(self, per_step: list[int]) -> None:
        with self._lock:
            for step, tokens in zip(self.states, per_step, strict=False):
                step.output_tokens = tokens

    # -- drawing -----------------------------------------------------------------------------

    def start(self) -> None:
        from relayllm.cli.progress_hook import ACTIVE

        ACTIVE.append(self)
        if self.console.tty:
            from tqdm import tqdm

            width = max(len(s.name) for s in self.states)
            self._bars = [
                tqdm(
                    total=s.total,
                    desc=f"step {s.name:<{width}}",
                    unit="rows",
                    # The rates and ETA are relayllm's (the postfix), not tqdm's.
                    bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} rows [{elapsed}{postfix}]",
                    position=i,
                    file=self.console.stream,
                    ncols=_columns(),
                    leave=True,
                    smoothing=0.1,
                )
                for i, s in enumerate(self.states)
            ]
        self._thread = threading.Thread(target=self._loop, daemon=True, name="relayllm-progress")
        self._thread.start()

    def stop(self) -> None:
        from relayllm.cli.progress_hook import ACTIVE

        if self in ACTIVE:
            ACTIVE.remove(self)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._draw(final=True)
        for bar in self._bars:
            bar.close()

    def _loop(self) -> None:
        wait = 0.5 if self.console.tty else self.console.interval_s
        while not self._stop.wait(wait):
            self._draw()
            self._check_stalls()

    def _draw(self, final: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            states = [_StepState(**vars(s)) for s in self.states]
        if self._bars:
            for bar, s in zip(self._bars, states, strict=False):
                if s.total is not None and bar.total != s.total:
                    bar.total = s.total
                bar.n = s.done
                bar.set_postfix_str(self.rates_text(s, now), refresh=False)
                bar.refresh()
        elif not final:
            for s in states:
                self.console.say(self.line(s, now))

    def line(self, s: _StepState, now: float) -> str:
        """One plain progress line: ``step answer: 120/400 rows (30%), 3.2 rows/s, ...``."""
        text = f"step {s.name}: {s.done}/{s.total if s.total is not None else '?'} rows"
        if s.total:
            text += f" ({100 * s.done / s.total:.0f}%)"
        return f"{text}, {self.rates_text(s, now)}"

    @staticmethod
    def rates_text(s: _StepState, now: float) -> str:
        """``3.2 rows/s, 40.1 tokens/s, ETA 2m05s``: the bar's and the plain line's, counted
        from the step's start as the summary counts them (not tqdm's own smoothed rate)."""
        rows, tokens = s.rates(now)
        text = f"{rows:.1f} rows/s"
        if s.output_tokens:
            text += f", {tokens:.1f} tokens/s"
        if s.total and rows > 0 and s.done < s.total:
            text += f", ETA {elapsed((s.total - s.done) / rows)}"
        return text

    def _check_stalls(self) -> None:
        now = time.monotonic()
        with self._lock:
            stalled = [
                s
                for s in self.states
                if (s.total is None or s.done < s.total)
                and now - s.last_change >= self.console.stall_s
                and now - s.warned_at >= self.console.stall_s
            ]
            for s in stalled:
                s.warned_at = now
        for s in stalled:
            self.console.say(
                f"warning: step {s.name} has made no progress for "
                f"{elapsed(now - s.last_change)}: {waiting_for(s)}"
            )


def waiting_for(s: _StepState) -> str:
    """What a stalled step waits for, from what its stage operator holds."""
    if s.active_tasks:
        return (
            f"its rows are at deployment {s.deployment!r}, which has not answered; is its "
            f"engine alive and not overloaded? (`relayllm status`, and the logs)"
        )
    if s.queued_blocks:
        return (
            "rows are queued for it but no stage actor or task runs them: the cluster has no "
            "free CPU for the step's stage (`ray status` shows what holds the CPUs)"
        )
    return "no rows have reached it yet: it waits for the input or the step before it"


def install_callback(*, ray_bars: bool = False) -> None:
    """Count rows through Ray Data's executor; Ray Data's own console progress only if
    ``ray_bars``."""
    from relayllm.cli.progress_hook import ProgressCallback
    from relayllm.data_context import use_progress

    use_progress(ProgressCallback, ray_bars=ray_bars)


__all__ = ["Console", "StepProgress", "install_callback", "elapsed"]
