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
