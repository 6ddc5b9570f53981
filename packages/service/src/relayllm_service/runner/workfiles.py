"""A claim's work files: carried over, the input fetched, expired lines written, lines counted."""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil

from relayllm.batch.format import parse_envelope
from relayllm.batch.output import error_line
from relayllm_service.errors import NotFoundError
from relayllm_service.store.files import PART, FileStorage

logger = logging.getLogger(__name__)

#: OpenAI's message for a line the completion window ran out on.
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


def carry_over(directory: str, claim: int, output: str, errors: str) -> None:
    """A claim's work files (``output``, ``errors``) start as copies of the newest earlier
    claim's (copies, not renames: a runner still writing to the old files must not reach
    these)."""
    if os.path.exists(output) or os.path.exists(errors):
        return
    earlier = sorted(
        (
            int(path.rsplit(".", 2)[-2])
            for path in glob.glob(os.path.join(directory, "out.*.jsonl"))
            if path.rsplit(".", 2)[-2].isdigit()
        ),
        reverse=True,
    )
    for before in earlier:
        if before < claim:
            for kind, mine in (("out", output), ("err", errors)):
                theirs = os.path.join(directory, f"{kind}.{before}.jsonl")
                if os.path.exists(theirs):
                    shutil.copyfile(theirs, mine)
            break
    for path in glob.glob(os.path.join(directory, "*.*.jsonl")):
        if path not in (output, errors):
            os.unlink(path)  # an older claim's: never read again
    for path in glob.glob(os.path.join(directory, f"*{PART}*")):
        os.unlink(path)  # an input copy a killed claim left cut short


def fetch_input(storage: FileStorage, file_id: str, path: str, claim: int) -> None:
    """The input file's bytes at ``path`` in the work directory (the read tasks read byte
    ranges)."""
    if os.path.exists(path):
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.part-{claim}"
    with storage.open(file_id) as source, open(partial, "wb") as copy:
        shutil.copyfileobj(source, copy, 1 << 20)
    os.replace(partial, path)


def expire_rest(input_path: str, output: str, errors: str) -> None:
    """Every line of the input in neither work file to the error file as ``batch_expired``."""
    from relayllm.batch.scan import read_done

    done = read_done(output, errors, False)
    with open(input_path, "rb") as source, open(errors, "a", encoding="utf-8") as err:
        for number, raw in enumerate(source, start=1):
            if not raw.strip():
                continue
            custom_id = parse_envelope(raw.decode("utf-8", "replace"), number).custom_id
            if custom_id in done.ids or (custom_id is None and number in done.bad_lines):
                continue
            line = error_line(number, custom_id, "batch_expired", EXPIRED_MESSAGE)
            err.write(json.dumps(line, ensure_ascii=False) + "\n")


def written_lines(path: str) -> int:
    """The lines of a work file that are not blank (0 when it does not exist)."""
    if not os.path.exists(path):
        return 0
    with open(path, "rb") as lines:
        return sum(1 for text in lines if text.strip())


def delete_quietly(storage: FileStorage, file_id: str) -> None:
    """A file's bytes deleted if they are there: one never written or already gone is no
    error, and any other failure is logged, not raised."""
    try:
        storage.delete(file_id)
    except NotFoundError:
        pass  # never written, or already deleted
    except Exception:
        logger.exception("could not delete the unpublished file %s", file_id)


__all__ = [
    "EXPIRED_MESSAGE",
    "carry_over",
    "delete_quietly",
    "expire_rest",
    "fetch_input",
    "written_lines",
]
