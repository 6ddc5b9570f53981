"""How many rows travel together: one block size for a pipeline's input and a batch file's
chunks.

A block reaches the output (and the disk) only when every row of it has passed every step, and
a kill loses the blocks in flight (docs/reliability.md); so a block is a small share of the
input. Every block also costs a Ray Data task and a drain of the stage's calls at its end; so a
block is never less than one stage batch (a smaller one would also be bundled with its
neighbours into one stage task), and grows with the input up to a cap.
"""

from __future__ import annotations

from relayllm.config import ProcessorSettings

#: A block is at most this many rows...
MAX_BLOCK_ROWS = 4096
#: ...and at most this share of the input (so a small job still writes as it goes).
BLOCKS_PER_INPUT = 16


def stage_batch(batch_size: int, max_in_flight_batches: int | None = None) -> int:
    """Rows of one Ray Data batch of the stage: ``batch_size`` x the calls in flight (None:
    the processor's default)."""
    if max_in_flight_batches is None:
        max_in_flight_batches = ProcessorSettings.model_fields["max_in_flight_batches"].default
    return int(batch_size * max_in_flight_batches)


def block_rows(total: int | None, stage_batch: int) -> int:
    """Rows per block of an input of ``total`` rows (None: not known in advance, one stage
    batch): 1/:data:`BLOCKS_PER_INPUT` of it, at most :data:`MAX_BLOCK_ROWS`, never less than
    ``stage_batch``."""
    if total is None:
        return stage_batch
    return max(stage_batch, min(MAX_BLOCK_ROWS, -(-total // BLOCKS_PER_INPUT)))


__all__ = ["BLOCKS_PER_INPUT", "MAX_BLOCK_ROWS", "block_rows", "stage_batch"]
