"""The batch service's settings refuse a bad key or value as the other config models do: one
``ConfigError`` naming the field, with the closest known key for a misspelt one (what
``relayllm serve`` prints, instead of pydantic's error and its input values)."""

import pytest

from relayllm.errors import ConfigError
from relayllm_service.settings import ServiceSettings


def test_a_misspelt_key_names_the_closest_known_one():
    with pytest.raises(ConfigError, match=r"prot: unknown key \(did you mean 'port'\?\)"):
        ServiceSettings(prot=8000)


def test_a_bad_value_names_the_field_and_the_rule():
    with pytest.raises(ConfigError) as refused:
        ServiceSettings(route_prefix="api/", max_batches=0)
    message = str(refused.value)
    assert "invalid ServiceSettings" in message and "route_prefix: must start with '/'" in message
    assert "max_batches:" in message


def test_settings_stay_frozen_and_pickle():
    import pickle

    settings = ServiceSettings(state_dir="/tmp/state", direct_port=None)
    assert pickle.loads(pickle.dumps(settings)) == settings
    with pytest.raises(Exception, match="frozen"):
        settings.port = 1  # type: ignore[misc]
