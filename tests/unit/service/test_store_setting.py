"""The service's ``store`` setting (``relayllm serve --store``): SQLite's file in the state
directory unless told, a ``postgresql://`` URL for PostgreSQL, and a bad value refused before
anything starts, naming the field, the password never shown."""

from __future__ import annotations

import pytest

from relayllm.errors import ConfigError
from relayllm_service.settings import ServiceSettings
from relayllm_service.store.location import open_store
from relayllm_service.store.postgres_file import PostgresFile
from relayllm_service.store.sqlite_file import SQLiteFile

SECRET = "hunter2-not-shown"


def test_the_default_store_is_sqlites_file_in_the_state_dir(tmp_path):
    settings = ServiceSettings(state_dir=str(tmp_path))
    assert settings.store is None
    assert settings.store_path == str(tmp_path / "jobs.sqlite")
    store = open_store(settings.store_path)
    try:
        assert isinstance(store.file, SQLiteFile)
    finally:
        store.close()
    elsewhere = ServiceSettings(state_dir=str(tmp_path), store="~/other.sqlite")
    assert elsewhere.store_path.endswith("/other.sqlite") and "~" not in elsewhere.store_path


def test_a_postgresql_url_selects_the_postgresql_store(postgres_url):
    settings = ServiceSettings(store=postgres_url)
    assert settings.store_path == postgres_url
    store = open_store(settings.store_path)
    try:
        assert isinstance(store.file, PostgresFile)
        store.add_file("alpha", filename="in.jsonl", purpose="batch", bytes=1)
    finally:
        store.close()


@pytest.mark.parametrize(
    "bad",
    [
        f"mysql://relay:{SECRET}@db.internal/jobs",
        f"postgresql://relay:{SECRET}@db.internal/jobs?no_such_option=1",
    ],
)
def test_a_bad_store_fails_naming_the_field_without_its_password(bad):
    pytest.importorskip("psycopg")
    with pytest.raises(ConfigError) as refused:
        ServiceSettings(store=bad)
    assert "store" in str(refused.value)
    assert SECRET not in str(refused.value)


def test_the_password_is_never_shown_by_the_settings():
    pytest.importorskip("psycopg")
    url = f"postgresql://relay:{SECRET}@db.internal:5432/jobs"
    settings = ServiceSettings(store=url)
    assert settings.store_path == url  # what the store connects with
    shown = [repr(settings), str(settings), str(settings.model_dump(mode="json"))]
    for text in shown:
        assert SECRET not in text and "relay:***@db.internal:5432/jobs" in text


def test_relayllm_serve_refuses_a_bad_store_before_it_connects(tmp_path, monkeypatch):
    import importlib

    from click.testing import CliRunner

    cli_serve = importlib.import_module("relayllm_service.cli.serve")
    connected: list[object] = []
    monkeypatch.setattr(cli_serve, "connect", lambda *args, **kwargs: connected.append(args))
    monkeypatch.setenv("RELAYLLM_API_KEYS", "alpha=" + "a" * 32)
    config = tmp_path / "deployments.yaml"
    config.write_text("deployments:\n  - name: echo\n    backend: echo\n")
    bad = f"mysql://relay:{SECRET}@db.internal/jobs"
    for args, environ in (([f"--store={bad}"], {}), ([], {"RELAYLLM_STORE": bad})):
        result = CliRunner().invoke(cli_serve.serve, [str(config), *args], env=environ)
        assert result.exit_code != 0
        assert "store" in result.output and SECRET not in result.output, result.output
    assert connected == []
