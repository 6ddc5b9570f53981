"""The admin key: the operator's, in no project, kept as a digest like the projects' keys; the
job store as it answers it (every project's batches and files, an id looked up in its
owner's project), and the store as a project's key still answers (its own only)."""

from __future__ import annotations

import pickle

import pytest

from relayllm.env import ADMIN_KEY as ADMIN_KEY_VARIABLE
from relayllm.env import API_KEYS
from relayllm.errors import ConfigError
from relayllm_service.errors import NotFoundError, UnauthorizedError
from relayllm_service.store.admin import AdminStore
from relayllm_service.store.sqlite import SQLiteJobStore
from relayllm_service.tenancy.keys import ADMIN, KeyMap, load_keys

ENV_KEYS = API_KEYS.name
ENV_ADMIN_KEY = ADMIN_KEY_VARIABLE.name

ADMIN_KEY = "operator-key-0123456789abcdef"
KEY_A = "sk-alpha-0123456789abcdefXYZ"


def test_the_admin_key_answers_to_no_project_and_is_kept_as_a_digest():
    keys = load_keys({ENV_KEYS: f"alpha={KEY_A}", ENV_ADMIN_KEY: ADMIN_KEY})
    assert keys.project_for(ADMIN_KEY) == ADMIN and keys.project_for(KEY_A) == "alpha"
    assert keys.project_for_header(f"Bearer {ADMIN_KEY}") == ADMIN
    assert ADMIN not in keys.projects and keys.has_admin
    for shown in (repr(keys), str(keys), pickle.dumps(keys).decode("latin-1")):
        assert ADMIN_KEY not in shown
    assert "admin key" in repr(keys)
    # the fingerprint tells a running gateway's admin key from another (a replaced gateway)
    other = load_keys({ENV_KEYS: f"alpha={KEY_A}", ENV_ADMIN_KEY: ADMIN_KEY + "x"})
    none = load_keys({ENV_KEYS: f"alpha={KEY_A}"})
    assert len({keys.fingerprint, other.fingerprint, none.fingerprint}) == 3
    with pytest.raises(UnauthorizedError):
        none.project_for(ADMIN_KEY)


@pytest.mark.parametrize(
    "environ, message",
    [
        ({ENV_KEYS: f"alpha={KEY_A}", ENV_ADMIN_KEY: "short"}, "at least 16"),
        ({ENV_KEYS: f"alpha={ADMIN_KEY}", ENV_ADMIN_KEY: ADMIN_KEY}, "is the admin key"),
    ],
)
def test_a_bad_admin_key_is_refused_naming_its_variable_never_its_text(environ, message):
    with pytest.raises(ConfigError, match=message) as refused:
        load_keys(environ)
    assert ADMIN_KEY not in str(refused.value) and KEY_A not in str(refused.value)
    assert ENV_ADMIN_KEY in str(refused.value) or ENV_KEYS in str(refused.value)


def test_a_project_key_given_as_the_admin_key_is_refused():
    with pytest.raises(ConfigError, match="also a project's key") as refused:
        KeyMap([("alpha", KEY_A)], admin=KEY_A)
    assert KEY_A not in str(refused.value)


def test_the_admin_key_alone_is_no_service():
    with pytest.raises(ConfigError, match="no API keys"):
        load_keys({ENV_ADMIN_KEY: ADMIN_KEY})
    assert KeyMap([("alpha", KEY_A)], admin=ADMIN_KEY).project_for(ADMIN_KEY) == ADMIN


@pytest.fixture
def store(tmp_path):
    opened = AdminStore(SQLiteJobStore(str(tmp_path / "jobs.sqlite")))
    yield opened
    opened.close()


def batch_of(store, project, name):
    upload = store.add_file(project, filename=name, purpose="batch", bytes=3)
    return store.create_batch(
        project, input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


def test_admin_lists_and_finds_every_projects_batches_and_files(store):
    a1, b1, a2 = (
        batch_of(store, "alpha", "a1"),
        batch_of(store, "beta", "b1"),
        batch_of(store, "alpha", "a2"),
    )
    assert store.projects() == ["alpha", "beta"]
    every = store.list_batches(ADMIN, limit=2)
    assert [b.id for b in every.data] == [a2.id, b1.id] and every.has_more
    rest = store.list_batches(ADMIN, after=b1.id, limit=2)
    assert [b.id for b in rest.data] == [a1.id] and not rest.has_more
    assert [b.id for b in store.list_batches("alpha").data] == [a2.id, a1.id]  # as before
    assert store.get_batch(ADMIN, b1.id).project == "beta"
    with pytest.raises(NotFoundError):  # a project's key still sees only its own
        store.get_batch("alpha", b1.id)
    assert store.cancel_batch(ADMIN, b1.id).status == "cancelling"
    files = store.list_files(ADMIN)
    assert {f.project for f in files.data} == {"alpha", "beta"} and len(files.data) == 3
    oldest_first = store.list_files(ADMIN, order="asc", limit=1)
    assert oldest_first.data[0].id == a1.input_file_id and oldest_first.has_more
    after = store.list_files(ADMIN, order="asc", after=a1.input_file_id)
    assert [f.id for f in after.data] == [b1.input_file_id, a2.input_file_id]
    assert store.get_file(ADMIN, b1.input_file_id).project == "beta"
    assert store.delete_file(ADMIN, b1.input_file_id).project == "beta"
    for missing in (lambda: store.get_file(ADMIN, b1.input_file_id),
                    lambda: store.get_batch(ADMIN, "batch_" + "0" * 32)):  # fmt: skip
        with pytest.raises(NotFoundError):
            missing()
