"""API keys to projects, from the environment and a keys file; and no key ever in a repr, a
str, a pickle or an error message, checked by one leak check that is itself shown to catch a
key map that keeps its keys."""

from __future__ import annotations

import pickle

import pytest

from relayllm.env import API_KEYS, API_KEYS_FILE
from relayllm.errors import ConfigError
from relayllm_service.errors import UnauthorizedError
from relayllm_service.tenancy.keys import KeyMap, load_keys

ENV_KEYS = API_KEYS.name
ENV_KEYS_FILE = API_KEYS_FILE.name

KEY_A = "sk-alpha-0123456789abcdefXYZ"
KEY_A2 = "sk-alpha-second-key-9876543210"
KEY_B = "sk-beta-abcdefghijklmnop-42"
SECRETS = (KEY_A, KEY_A2, KEY_B)


def leaked(thing, secrets=SECRETS):
    """The secrets found in what a log line, a traceback or Serve's shipping of an object
    would show of it."""
    shown = [repr(thing), str(thing)]
    try:
        shown.append(pickle.dumps(thing).decode("latin-1"))
    except (pickle.PicklingError, TypeError, AttributeError):
        pass
    if isinstance(thing, BaseException):
        shown += [repr(a) for a in thing.args]
    for part in (vars(thing) if hasattr(thing, "__dict__") else {}).values():
        shown.append(repr(part))
    return [s for s in secrets if any(s in text for text in shown)]


def test_keys_from_the_environment_and_a_file_are_merged(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"# team keys\n\nalpha={KEY_A2}\n  beta = {KEY_B}  \n")
    keys = load_keys({ENV_KEYS: f"alpha={KEY_A}", ENV_KEYS_FILE: str(path)})
    assert len(keys) == 3 and keys.projects == {"alpha", "beta"}
    assert keys.project_for(KEY_A) == keys.project_for(KEY_A2) == "alpha"
    assert keys.project_for(KEY_B) == "beta"
    assert keys.project_for_header(f"Bearer {KEY_B}") == "beta"
    assert keys.project_for_header(f"bearer  {KEY_A}") == "alpha"
    only_env = load_keys({ENV_KEYS: f"alpha={KEY_A},\nbeta={KEY_B}"})
    assert only_env.projects == {"alpha", "beta"}
    explicit = load_keys({}, path=str(path))
    assert explicit.project_for(KEY_B) == "beta"


def test_unknown_missing_and_malformed_credentials_are_refused():
    keys = KeyMap([("alpha", KEY_A)])
    for bad in (KEY_B, KEY_A + "x", KEY_A[:-1], " " + KEY_A):
        with pytest.raises(UnauthorizedError, match="not valid"):
            keys.project_for(bad)
    for header in (None, "", f"Basic {KEY_A}", KEY_A):
        with pytest.raises(UnauthorizedError):
            keys.project_for_header(header)
    open_server = KeyMap([("alpha", KEY_A)], anonymous="default")
    assert open_server.project_for(None) == open_server.project_for_header(None) == "default"
    with pytest.raises(UnauthorizedError):
        open_server.project_for(KEY_B)  # a wrong key is refused even where none is needed


def test_no_keys_at_all_is_a_config_error_unless_keyless_requests_have_a_project():
    with pytest.raises(ConfigError, match=ENV_KEYS):
        load_keys({})
    assert load_keys({}, anonymous="default").project_for(None) == "default"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (KEY_A, "no '='"),  # a key with no project
        (f"{KEY_A}=alpha", "looks like an API key"),  # the wrong way round
        (f"al pha={KEY_A}", "project name"),
        (f"alpha={KEY_A}\nbeta={KEY_A}", "same key"),
        (f"alpha={KEY_A[:10]}", "at least 16"),
        (f"alpha={KEY_A} {KEY_B}", "without spaces"),
        (f"=={KEY_B}", "project name"),
    ],
)
def test_malformed_keys_are_config_errors_that_never_quote_a_key(tmp_path, text, reason):
    with pytest.raises(ConfigError, match=reason) as from_env:
        load_keys({ENV_KEYS: text})
    message = str(from_env.value)
    assert ENV_KEYS in message and ("line 1" in message or "line 2" in message)
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(ConfigError, match=reason) as from_file:
        load_keys({}, path=str(path))
    for error in (from_env.value, from_file.value):
        assert leaked(error) == [], f"{error!r} shows a key"
        assert error.__cause__ is None and error.__context__ is None


def test_a_keys_file_that_is_not_text_or_not_there_says_so_without_its_bytes(tmp_path):
    path = tmp_path / "keys"
    path.write_bytes(f"alpha={KEY_A}\n".encode() + b"\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8") as caught:
        load_keys({}, path=str(path))
    assert leaked(caught.value) == [] and caught.value.__context__ is None
    with pytest.raises(ConfigError, match="cannot read"):
        load_keys({}, path=str(tmp_path / "missing"))


def test_a_key_map_never_shows_a_key(tmp_path):
    keys = load_keys({ENV_KEYS: f"alpha={KEY_A},alpha={KEY_A2},beta={KEY_B}"})
    assert leaked(keys) == []
    assert repr(keys) == str(keys) == "KeyMap(3 keys, projects=['alpha', 'beta'])"
    shipped = pickle.loads(pickle.dumps(keys))
    assert shipped.project_for(KEY_B) == "beta", "a pickled map (as Serve ships it) still works"
    for bad in (KEY_A + "!", "Bearer " + KEY_B + "x"):
        try:
            keys.project_for_header(bad)
        except UnauthorizedError as exc:
            assert leaked(exc, (bad, KEY_A, KEY_B)) == []
        else:
            raise AssertionError("a wrong key was accepted")


class KeepsItsKeys:
    """A key map done the obvious way: a dict from key to project."""

    def __init__(self, pairs):
        self.by_key = {key: project for project, key in pairs}

    def __repr__(self):
        return f"KeepsItsKeys({len(self.by_key)} keys)"


def test_the_leak_check_catches_a_map_that_keeps_its_keys():
    """Its repr shows nothing, but a pickle (or a debugger's view of its attributes) does."""
    naive = KeepsItsKeys([("alpha", KEY_A), ("beta", KEY_B)])
    assert KEY_A not in repr(naive)
    assert sorted(leaked(naive)) == sorted([KEY_A, KEY_B])
    assert leaked(ConfigError(f"entry 1: bad key {KEY_B}")) == [KEY_B]


def test_a_comment_with_a_comma_is_skipped_whole():
    key = "k" * 32
    keys = KeyMap.parse(f"# alpha, beta: one key each\nalpha={key}", "keys.txt")
    assert keys.projects == frozenset({"alpha"})


@pytest.mark.parametrize(
    "project",
    ["sk-" + "a" * 30, "Xq7RtZ0pLm3NvB8sKd2WfY6hJc", "SK_live_abcdefghijklmnop"],
)
def test_an_entry_written_key_equals_project_is_refused_without_its_text(project):
    text = f"alpha={'k' * 32}\n{project}=alpha-research-team-01"
    with pytest.raises(ConfigError, match="line 2, entry 2") as raised:
        KeyMap.parse(text, "keys.txt")
    assert project not in str(raised.value) and "alpha-research" not in str(raised.value)


def test_ordinary_long_project_names_are_not_taken_for_keys():
    keys = KeyMap.parse(f"research-team-2024-summer-interns={'k' * 32}", "keys.txt")
    assert keys.projects == frozenset({"research-team-2024-summer-interns"})
