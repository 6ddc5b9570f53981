"""The console: a web page the gateway serves at ``/console`` (under its route prefix) showing
the batches of every project (the admin key) or of one (a project's key), their progress and
files, and the deployments behind them with each replica's figures.

Signing in. A browser cannot put an ``Authorization`` header on a link, so the key is given
once, in a form posted to ``/console/login``; the answer sets a session cookie (HttpOnly:
no script reads it; SameSite=Strict: no other site's page sends it; its Path the console's)
and the key is not kept anywhere. The cookie holds the project, an expiry and an HMAC of
both under a secret the gateway replica draws when it starts: a forged or altered cookie
fails the check, a restarted gateway (new keys, perhaps) signs everyone out. A client that
can send headers (curl, a test) may give ``Authorization: Bearer KEY`` instead. The console
only reads: it changes nothing, so a request another site forges gains nothing.

Downloads (``/console/files/{id}``) are the same file bytes as ``/v1/files/{id}/content``,
authorised by the cookie, with the file's name for the browser to save it under.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import secrets
import time
import urllib.parse
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from relayllm_service.console import page as pages
from relayllm_service.errors import NotFoundError, UnauthorizedError
from relayllm_service.ids import is_file_id
from relayllm_service.store.admin import AdminStore
from relayllm_service.store.files import CHUNK, FileStorage
from relayllm_service.tenancy.keys import ADMIN, key_id
from relayllm_service.tenancy.projects import Keys
from relayllm_service.tenancy.signins import SignInLimit, TooManySignInsError, client_address
from relayllm_service.tenancy.usage import UsageLedger, Use

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

logger = logging.getLogger(__name__)

COOKIE = "relayllm_console"
#: How long a sign-in lasts.
SESSION_S = 12 * 3600
#: Batches shown per project (newest first).
SHOWN = 100
#: The deployments' figures are asked of their replicas at most this often, however many
#: browsers renew the page.
DEPLOYMENTS_TTL_S = 2.0
HEADERS = {
    "Content-Security-Policy": pages.CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class Console:
    """The console's routes, on the gateway's store, keys and file storage."""

    def __init__(
        self,
        store: AdminStore,
        keys: Keys,
        storage: FileStorage,
        ledger: UsageLedger,
        signins: SignInLimit | None = None,
    ) -> None:
        self.store, self.keys, self.storage, self.ledger = store, keys, storage, ledger
        self.signins = signins or SignInLimit()  # the gateway's: one count per address
        self._secret = secrets.token_bytes(32)  # per replica: a restart signs everyone out
        self._deployments: tuple[float, list[dict[str, Any]], str | None] = (0.0, [], None)
        self._lock = asyncio.Lock()

    def routes(self) -> list[Any]:
        from starlette.routing import Route

        return [
            Route("/console", self.page, methods=["GET"]),
            Route("/console/login", self.login, methods=["POST"]),
            Route("/console/logout", self.logout, methods=["POST"]),
            Route("/console/files/{file_id}", self.download, methods=["GET"]),
        ]

    # -- who is asking ---------------------------------------------------------------------

    def _sign(self, project: str, expires: int, key: str) -> str:
        payload = f"{project}|{expires}|{key_id(key)}".encode()
        mac = hmac.new(self._secret, payload, hashlib.sha256).digest()
        return ".".join(base64.urlsafe_b64encode(p).decode() for p in (payload, mac))

    def _session(self, cookie: str | None) -> str | None:
        """The project of a valid, unexpired session cookie whose key is still the project's
        (a key rotated or removed from the keys file ends its sessions at once), else None."""
        try:
            payload, mac = (base64.urlsafe_b64decode(p) for p in (cookie or "").split("."))
            project, expires, key = payload.decode().rsplit("|", 2)
        except ValueError:
            return None
        good = hmac.new(self._secret, payload, hashlib.sha256).digest()
        if not hmac.compare_digest(mac, good) or int(expires) < time.time():
            return None
        return project if self.keys.has_key_id(project, key) else None

    def viewer(self, request: Request) -> str | None:
        """The project of the request's key (a header) or session (the cookie); None for
        neither. A header with a wrong key is refused, not taken for a missing one."""
        if request.headers.get("authorization"):
            return self.signins.project_of(request, self.keys)
        return self._session(request.cookies.get(COOKIE))

    @staticmethod
    def _base(request: Request) -> str:
        """The console's path as the browser reaches it (under the route prefix)."""
        return (request.scope.get("root_path") or "").rstrip("/") + "/console"

    # -- routes ----------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        base = self._base(request)
        try:
            viewer = self.viewer(request)
        except UnauthorizedError:
            viewer = None
        except TooManySignInsError as exc:
            return _refused(exc, base)
        if viewer is None:
            return _html(pages.login_page(base + "/login"), 401)
        batches = await asyncio.to_thread(self._batches, viewer)
        usage = await asyncio.to_thread(self._usage, batches)
        found, problem = await self._deployments_now()
        text = pages.console_page(
            viewer=viewer,
            base=base,
            batches=batches,
            usage=usage,
            deployments=found,
            deployments_problem=problem,
        )
        return _html(text)

    def _batches(self, viewer: str) -> dict[str, list[Any]]:
        """The newest batches of each project the viewer sees, by project name."""
        if viewer != ADMIN:
            return {viewer: self.store.list_batches(viewer, limit=SHOWN).data}
        projects = sorted(set(self.store.projects()) | self.keys.projects)
        return {p: self.store.list_batches(p, limit=SHOWN).data for p in projects}

    def _usage(self, batches: dict[str, list[Any]]) -> dict[str, Use]:
        """Each shown batch's tokens so far (the usage ledger's, all its models summed)."""
        found = {}
        for group in batches.values():
            for batch in group:
                totals = self.ledger.batch_totals(batch.id).values()
                found[batch.id] = sum(totals, Use(requests=0))
        return found

    async def login(self, request: Request) -> Response:
        base = self._base(request)
        form = urllib.parse.parse_qs((await request.body())[:4096].decode("utf-8", "replace"))
        key = (form.get("key") or [""])[0].strip()
        try:
            project = self.signins.project_for(client_address(request), key, self.keys)
        except UnauthorizedError:
            project = None
        except TooManySignInsError as exc:
            return _refused(exc, base)
        if project is None:
            return _html(pages.login_page(base + "/login", "That key was refused."), 401)
        from starlette.responses import RedirectResponse

        expires = int(time.time()) + SESSION_S
        response = RedirectResponse(base, status_code=303, headers=HEADERS)
        response.set_cookie(
            COOKIE,
            self._sign(project, expires, key),
            max_age=SESSION_S,
            path=base,
            httponly=True,
            samesite="strict",
        )
        return response

    async def logout(self, request: Request) -> Response:
        from starlette.responses import RedirectResponse

        base = self._base(request)
        response = RedirectResponse(base, status_code=303, headers=HEADERS)
        response.delete_cookie(COOKIE, path=base, httponly=True, samesite="strict")
        return response

    async def download(self, request: Request) -> Response:
        from starlette.responses import StreamingResponse

        file_id = request.path_params.get("file_id")
        try:
            viewer = self.viewer(request)
        except UnauthorizedError:
            viewer = None
        except TooManySignInsError as exc:
            return _refused(exc, self._base(request))
        if viewer is None:
            return _html(pages.login_page(self._base(request) + "/login"), 401)
        try:
            if not is_file_id(file_id):
                raise NotFoundError(f"no file {file_id!r}")
            record = await asyncio.to_thread(self.store.get_file, viewer, str(file_id))
            source = await asyncio.to_thread(self.storage.open, record.id)
        except NotFoundError:
            return _html(pages.document("not found", "<p>No such file.</p>"), 404)

        def chunks() -> Iterator[bytes]:
            with source:
                while piece := source.read(CHUNK):
                    yield piece

        name = urllib.parse.quote(record.filename, safe="")
        headers = {**HEADERS, "Content-Disposition": f"attachment; filename*=UTF-8''{name}"}
        return StreamingResponse(chunks(), media_type="application/jsonl", headers=headers)

    # -- the deployments -------------------------------------------------------------------

    async def _deployments_now(self) -> tuple[list[dict[str, Any]], str | None]:
        async with self._lock:
            at, found, problem = self._deployments
            if time.monotonic() - at > DEPLOYMENTS_TTL_S:
                found, problem = await asyncio.to_thread(_deployments)
                self._deployments = (time.monotonic(), found, problem)
        return found, problem


def _deployments() -> tuple[list[dict[str, Any]], str | None]:
    """Each running deployment's replicas as their ``info()`` tells them (what ``relayllm
    status`` shows); a deployment that does not answer is listed with its status."""
    from relayllm.deployments import control, list_deployments

    try:
        refs = list_deployments()
    except Exception as exc:
        logger.warning("the console could not list the deployments", exc_info=True)
        return [], f"The deployments could not be listed ({type(exc).__name__})."
    found: list[dict[str, Any]] = []
    for ref in refs:
        base = {"name": ref.name, "status": ref.status}
        try:
            replicas = control(ref.name).replicas(timeout_s=5)
        except Exception as exc:
            found.append({**base, "activity": f"no answer ({type(exc).__name__})"})
            continue
        for info in replicas.values():
            found.append({**info, **base, "activity": _activity(info)})
    return found, None


def _activity(info: dict[str, Any]) -> str:
    """idle, busy or paused, as ``relayllm status`` says it."""
    if info.get("paused"):
        return f"paused ({info['paused']})"
    return "busy" if info.get("ongoing") else "idle"


def _html(text: str, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    from starlette.responses import HTMLResponse

    return HTMLResponse(text, status_code=status, headers={**HEADERS, **(headers or {})})


def _refused(exc: TooManySignInsError, base: str) -> Response:
    """The sign-in page, 429 with ``Retry-After``: too many refused keys from this address."""
    return _html(pages.login_page(base + "/login", exc.message), 429, exc.headers)


__all__ = ["COOKIE", "Console"]
