"""Fixtures the batch service's unit tests share."""

from __future__ import annotations

import pytest


@pytest.fixture
def service(tmp_path):
    """A batch service's state on disk, no Ray: (settings, job store, file storage)."""
    from relayllm_service.settings import ServiceSettings
    from relayllm_service.store.files import FileStorage
    from relayllm_service.store.sqlite import SQLiteJobStore

    settings = ServiceSettings(state_dir=str(tmp_path / "state"))
    (tmp_path / "state").mkdir()
    store = SQLiteJobStore(settings.store_path)
    storage = FileStorage.from_uri(settings.files_location)
    yield settings, store, storage
    store.close()


# -- a real PostgreSQL server, for the store's conformance tests ----------------------------
#
# One server per test session, on a unix socket in its own temporary directory (no TCP port:
# the unit tier's sockets stay off); a fresh database per test. PostgreSQL refuses to run as
# root, so as root the server runs as the `postgres` user Debian's package makes.

PG_HOW = (
    "sudo apt-get install -y --no-install-recommends postgresql (as root: python .ci/postgresql.py)"
)
PSYCOPG_HOW = "pip install 'relayllm-service[postgresql]'"


def _pg_bin(name: str) -> str | None:
    import glob
    import shutil

    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _pg_missing(why: str, how: str = PG_HOW):
    """Skip the PostgreSQL half of a test, saying what to install; in CI, fail it."""
    import os

    message = f"PostgreSQL is not usable here ({why}): {how}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_server():
    """The socket directory of a PostgreSQL server started for this session."""
    import os
    import pwd
    import shutil
    import subprocess
    import tempfile

    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        _pg_missing("no initdb or pg_ctl")
    run_as: list[str] = []
    home = tempfile.mkdtemp(prefix="relayllm-pg-")
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            _pg_missing("running as root and there is no postgres user")
        os.chown(home, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    data, log = os.path.join(home, "data"), os.path.join(home, "server.log")
    try:
        subprocess.run(
            [*run_as, initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        options = f"-c listen_addresses='' -k {home} -c fsync=off"
        subprocess.run(
            [*run_as, pg_ctl, "-D", data, "-l", log, "-o", options, "-w", "-t", "60", "start"],
            check=True,
            capture_output=True,
            timeout=90,
        )
    except subprocess.CalledProcessError as failed:
        shutil.rmtree(home, ignore_errors=True)
        raise AssertionError(f"PostgreSQL did not start: {failed.stderr!r}") from None
    try:
        yield home
    finally:
        subprocess.run([*run_as, pg_ctl, "-D", data, "-m", "immediate", "stop"], timeout=60)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server, request):
    """A fresh database on the session's server, as a ``postgresql://`` URL."""
    import uuid

    try:
        import psycopg
    except ImportError:
        _pg_missing("psycopg is not installed", PSYCOPG_HOW)
    name = f"test_{uuid.uuid4().hex}"
    admin = f"postgresql://postgres@/postgres?host={postgres_server}"
    with psycopg.connect(admin, autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql://postgres@/{name}?host={postgres_server}"
    with psycopg.connect(admin, autocommit=True) as db:
        db.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
