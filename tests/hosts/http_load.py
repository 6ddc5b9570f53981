"""Chat requests to a deployment's HTTP front, one after another, until a stop file appears:
one JSON line per request (when it was sent, how it ended) on stdout. Run inside a host, as a
client on that network would (the real ``openai`` client, no retries of its own: each failure
is counted)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import openai


def main(base_url: str, model: str, stop: Path) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=30)
    i = 0
    while not stop.exists():
        sent = time.time()
        try:
            reply = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"request {i}"}], max_tokens=4
            )
            outcome = {"ok": reply.choices[0].message.content == f"request {i}"}
        except openai.APIStatusError as exc:
            outcome = {"status": exc.status_code}
        except openai.APIConnectionError as exc:
            outcome = {"connection": type(exc).__name__}
        print(json.dumps({"i": i, "sent": sent, "took": time.time() - sent, **outcome}), flush=True)
        i += 1
        time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
