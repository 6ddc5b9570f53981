"""The console's HTML, rendered on the server from the store's records and the deployments'
``info()``: no template engine, no JavaScript build. Every value that reaches the page goes
through :func:`esc` (a batch's metadata, a file's name and a project are a client's words);
the markup around them is this module's constants.

The page renews itself while a batch runs: a few lines of script fetch the page again every
:data:`REFRESH_S` seconds and swap its ``<main>`` (the scroll position stays); without
script a ``<noscript>`` refresh reloads it. The script is inline and allowed by its hash in
the page's Content-Security-Policy, so no other script can run on it.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from relayllm_service.store.records import BatchRecord

#: Seconds between two renewals of the page while a batch is not finished.
REFRESH_S = 2

SCRIPT = (
    "setInterval(async()=>{const m=document.querySelector('main[data-live]');if(!m)return;"
    "const r=await fetch(location.href,{credentials:'same-origin'});if(!r.ok)return;"
    "const d=new DOMParser().parseFromString(await r.text(),'text/html');"
    "const n=d.querySelector('main');if(n)m.replaceWith(n);}," + str(REFRESH_S * 1000) + ");"
)
SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
#: Only this page's own script, styles and forms: a value that slipped its escaping could
#: still run nothing.
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    f"script-src 'sha256-{SCRIPT_HASH}'; connect-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1d2b3a;color:#fff;padding:10px 24px;display:flex;gap:16px;align-items:center}
header h1{font-size:17px;margin:0;flex:1}header form{margin:0}
main{padding:8px 24px 32px;max-width:1280px}
h2{font-size:16px;margin:22px 0 8px}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #dde1e6}
th,td{text-align:left;padding:5px 10px;border-bottom:1px solid #eceef1;vertical-align:top}
th{background:#eef1f4;font-weight:600;font-size:13px}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
th,.nw{white-space:nowrap}
code{font:12px ui-monospace,monospace}
.status{padding:1px 7px;border-radius:9px;font-size:12px;background:#e5e8ec}
.s-completed{background:#d5f0dc}.s-in_progress,.s-finalizing,.s-validating{background:#dbe9fb}
.s-failed,.s-expired{background:#f8d7d7}.s-cancelled,.s-cancelling{background:#f1e6c8}
progress{width:120px;vertical-align:middle}.muted{color:#6b7580}
.login{max-width:420px;margin:80px auto;background:#fff;padding:24px;border:1px solid #dde1e6}
.login input{width:100%;box-sizing:border-box;padding:7px;margin:8px 0}
.error{color:#a01818}
"""


def esc(value: Any) -> str:
    """Text for HTML (element content and quoted attributes)."""
    return html.escape("" if value is None else str(value), quote=True)


def when(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def document(title: str, body: str, *, live: bool = False) -> str:
    refresh = f'<noscript><meta http-equiv="refresh" content="{REFRESH_S}"></noscript>'
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{esc(title)}</title><style>{STYLE}</style>"
        f"{refresh if live else ''}</head><body>{body}"
        f"<script>{SCRIPT}</script></body></html>"
    )


def login_page(action: str, problem: str | None = None) -> str:
    said = f'<p class="error" role="alert">{esc(problem)}</p>' if problem else ""
    body = (
        '<div class="login"><h1>relayllm batch service</h1>'
        "<p>Sign in with a project's API key (its batches) or the admin key (every "
        f"project's).</p>{said}"
        f'<form method="post" action="{esc(action)}">'
        '<label for="key">API key</label>'
        '<input id="key" name="key" type="password" autocomplete="off" required autofocus>'
        '<button type="submit">Sign in</button></form></div>'
    )
    return document("relayllm console: sign in", body)


def console_page(
    *,
    viewer: str,
    base: str,
    batches: Mapping[str, Sequence[BatchRecord]],
    usage: Mapping[str, Any],
    deployments: Sequence[Mapping[str, Any]],
    deployments_problem: str | None,
) -> str:
    """The whole page: one table of batches per project, then the deployments."""
    live = any(not b.terminal for group in batches.values() for b in group)
    sections = [_project(project, group, base, usage) for project, group in batches.items()]
    if not sections:
        sections = ['<p class="muted">No batches yet.</p>']
    who = "admin: every project" if viewer == "*" else f"project {viewer}"
    header = (
        f"<header><h1>relayllm batch service</h1><span>{esc(who)}</span>"
        f'<form method="post" action="{esc(base)}/logout"><button>Sign out</button></form>'
        "</header>"
    )
    state = "data-live" if live else ""
    main = (
        f"<main {state}>"
        + "".join(sections)
        + _deployments(deployments, deployments_problem)
        + f'<p class="muted">Shown at {esc(when(_now()))} UTC'
        + (f"; renewed every {REFRESH_S} s while a batch runs." if live else ".")
        + "</p></main>"
    )
    return document("relayllm console", header + main, live=live)


def _project(
    project: str, group: Sequence[BatchRecord], base: str, usage: Mapping[str, Any]
) -> str:
    rows = "".join(_batch_row(b, base, usage.get(b.id)) for b in group) or (
        '<tr><td colspan="8" class="muted">No batches.</td></tr>'
    )
    return (
        f'<section data-project="{esc(project)}"><h2>Project {esc(project)}</h2>'
        "<table><thead><tr><th>batch</th><th>status</th><th>progress</th><th>failed</th>"
        "<th>tokens in/out</th><th>created (UTC)</th><th>metadata</th><th>files</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></section>"
    )


def _batch_row(batch: BatchRecord, base: str, use: Any) -> str:
    counts = batch.request_counts
    done = counts.completed + counts.failed
    bar = f'<progress value="{done}" max="{max(counts.total, 1)}"></progress>'
    metadata = "<br>".join(
        f"<code>{esc(key)}</code>={esc(value)}" for key, value in (batch.metadata or {}).items()
    )
    links = [
        f'<a href="{esc(base)}/files/{esc(file_id)}" download>{label}</a>'
        for label, file_id in (("output", batch.output_file_id), ("errors", batch.error_file_id))
        if file_id
    ]
    return (
        f'<tr data-batch="{esc(batch.id)}"><td><code>{esc(batch.id)}</code></td>'
        f'<td><span class="status s-{esc(batch.status)}">{esc(batch.status)}</span></td>'
        f'<td class="num">{bar} <span class="progress">{done}/{counts.total}</span></td>'
        f'<td class="num">{counts.failed}</td>'
        f'<td class="num tokens">{_tokens(use)}</td>'
        f'<td class="nw">{esc(when(batch.created_at))}</td>'
        f"<td>{metadata}</td><td>{' '.join(links) or '-'}</td></tr>"
    )


def _tokens(use: Any) -> str:
    """Input and output tokens the usage ledger charged the batch so far ("-": none yet)."""
    if use is None or not use.requests:
        return "-"
    return f"{use.input_tokens:,} / {use.output_tokens:,}"


DEPLOYMENT_COLUMNS = ("deployment", "status", "backend", "model", "replica", "activity")
REPLICA_NUMBERS = ("ongoing", "rows", "queue", "prefix hit")


def _deployments(found: Sequence[Mapping[str, Any]], problem: str | None) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in (*DEPLOYMENT_COLUMNS, *REPLICA_NUMBERS))
    rows = "".join(_replica_row(item) for item in found)
    if not rows:
        rows = f'<tr><td colspan="10" class="muted">{esc(problem or "No deployments.")}</td></tr>'
    return (
        "<section><h2>Deployments</h2>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></section>"
    )


def _replica_row(item: Mapping[str, Any]) -> str:
    metrics = item.get("metrics") or {}
    queue = metrics.get("queue")
    hit = metrics.get("prefix_cache_hit_rate")
    cells: Iterable[Any] = (
        item.get("name"),
        item.get("status"),
        item.get("backend"),
        item.get("model"),
        item.get("replica_id"),
        item.get("activity"),
    )
    numbers = (
        item.get("ongoing"),
        item.get("rows"),
        "-" if not queue else f"{queue.get('waiting')}/{queue.get('running')}",
        "-" if hit is None else f"{hit * 100:.0f}%",
    )
    return (
        "<tr>"
        + "".join(f"<td>{esc('-' if c is None else c)}</td>" for c in cells)
        + "".join(f'<td class="num">{esc("-" if n is None else n)}</td>' for n in numbers)
        + "</tr>"
    )


def _now() -> int:
    import time

    return int(time.time())


__all__ = ["CSP", "REFRESH_S", "console_page", "esc", "login_page"]
