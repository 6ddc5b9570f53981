"""Projects managed without a restart, without Ray: the keys file and the quotas file read
again when they change (a rotated key refused from the next call, a console session of the
old key ended), a file that no longer parses leaving the last good one in force, the runner's
weights following the quotas file, and a keys map that pickles (Serve ships it)."""

from __future__ import annotations

import logging
import os
import pickle

import pytest

from relayllm_service.errors import UnauthorizedError
from relayllm_service.store.sqlite import SQLiteJobStore
from relayllm_service.tenancy.keys import ADMIN
from relayllm_service.tenancy.projects import quotas_now, service_keys
from relayllm_service.tenancy.quotas import Quotas

OLD, NEW, OTHER = "gamma-old-" + "o" * 20, "gamma-new-" + "n" * 20, "delta-key-" + "d" * 20
ENV = {"RELAYLLM_API_KEYS": "alpha=alpha-key-" + "a" * 20, "RELAYLLM_ADMIN_KEY": "z" * 24}


def replace(path, text):
    """Write the file as an operator should: a new file moved over the old one."""
    part = path.with_name(path.name + ".new")
    part.write_text(text)
    os.replace(part, path)


def test_a_rotated_key_is_refused_at_the_next_call_and_the_new_one_works(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text(f"gamma={OLD}\n")
    keys = service_keys(ENV, str(path))
    assert keys.project_for(OLD) == "gamma"
    replace(path, f"gamma={NEW}\n")
    with pytest.raises(UnauthorizedError):
        keys.project_for(OLD)
    assert keys.project_for(NEW) == "gamma"
    assert keys.project_for("alpha-key-" + "a" * 20) == "alpha"  # the environment's stay
    assert keys.project_for("z" * 24) == ADMIN


def test_a_key_rewritten_in_place_with_the_same_size_is_seen(tmp_path):
    """An editor saving in place: same inode, same size."""
    path = tmp_path / "keys.txt"
    path.write_text(f"gamma={OLD}\n")
    keys = service_keys(ENV, str(path))
    assert keys.project_for(OLD) == "gamma" and len(OLD) == len(NEW)
    path.write_text(f"gamma={NEW}\n")
    with pytest.raises(UnauthorizedError):
        keys.project_for(OLD)


def test_adding_and_disabling_a_project(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text(f"gamma={OLD}\n")
    keys = service_keys(ENV, str(path))
    with pytest.raises(UnauthorizedError):
        keys.project_for(OTHER)
    replace(path, f"gamma={OLD}\ndelta={OTHER}\n")
    assert keys.project_for(OTHER) == "delta" and "delta" in keys.projects
    replace(path, f"gamma={OLD}\n# delta={OTHER}   disabled\n")
    with pytest.raises(UnauthorizedError):
        keys.project_for(OTHER)
    assert "delta" not in keys.projects


def test_a_file_that_no_longer_parses_leaves_the_last_good_keys_and_says_why(tmp_path, caplog):
    path = tmp_path / "keys.txt"
    path.write_text(f"gamma={OLD}\n")
    keys = service_keys(ENV, str(path))
    replace(path, f"gamma={NEW}\nthis line has no equals sign {OTHER}\n")
    with caplog.at_level(logging.ERROR, logger="relayllm_service.tenancy.projects"):
        assert keys.project_for(OLD) == "gamma"  # the last good file's
        keys.project_for(OLD)
    complaints = [r.getMessage() for r in caplog.records]
    assert len(complaints) == 1 and "line 2" in complaints[0]  # once, naming the entry
    assert OTHER not in complaints[0] and NEW not in complaints[0]  # never a key
    replace(path, f"gamma={NEW}\n")
    assert keys.project_for(NEW) == "gamma"


def test_the_live_keys_pickle_without_any_key_and_keep_reading_the_file(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text(f"gamma={OLD}\n")
    shipped = pickle.dumps(service_keys(ENV, str(path)))
    assert OLD.encode() not in shipped and b"alpha-key" not in shipped
    keys = pickle.loads(shipped)
    replace(path, f"gamma={NEW}\n")
    assert keys.project_for(NEW) == "gamma"


def test_the_fingerprint_names_the_file_not_its_contents(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text(f"gamma={OLD}\n")
    before = service_keys(ENV, str(path)).fingerprint
    replace(path, f"gamma={NEW}\n")
    assert service_keys(ENV, str(path)).fingerprint == before  # the running gateway is kept
    assert service_keys({**ENV, "RELAYLLM_ADMIN_KEY": "y" * 24}, str(path)).fingerprint != before


def test_a_quota_changed_in_the_file_applies_to_the_next_request(tmp_path):
    path = tmp_path / "quotas.yaml"
    path.write_text("gamma: {requests_per_minute: 5}\n")
    store = SQLiteJobStore(str(tmp_path / "jobs.sqlite"))
    try:
        quotas = Quotas.install(store, {}, quotas_now(str(path), {}))
        quotas.admit_request(store.file, "gamma", now=600)
        replace(path, "gamma: {requests_per_minute: 1, weight: 3}\n")
        with pytest.raises(Exception, match="Limit 1, Used 1"):
            quotas.admit_request(store.file, "gamma", now=601)
        replace(path, "gamma: {requests_per_minute: [not a number]}\n")
        with pytest.raises(Exception, match="Limit 1"):  # the last good file's
            quotas.admit_request(store.file, "gamma", now=602)
    finally:
        store.close()


def test_the_runner_takes_its_weights_from_the_quotas_file_as_it_is_now(tmp_path):
    from relayllm_service.runner.loop import BatchRunner
    from relayllm_service.settings import ServiceSettings

    path = tmp_path / "quotas.yaml"
    path.write_text("gamma: {weight: 1}\n")
    settings = ServiceSettings(state_dir=str(tmp_path), quotas_file=str(path), poll_s=3600)
    runner = BatchRunner(settings)
    try:
        assert runner.fair.weight("gamma") == 1
        replace(path, "gamma: {weight: 2}\n'*': {weight: 0.5}\n")
        assert runner.fair.weight("gamma") == 2 and runner.fair.weight("other") == 0.5
    finally:
        runner.store.close()
