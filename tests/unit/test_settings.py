"""Worker settings from KDIV_* variables: values, defaults, and errors that name the variable."""

from __future__ import annotations

import re

import pytest

from kdiv.config.settings import Settings, SettingsError


def test_defaults_and_values():
    settings = Settings.from_env({"KDIV_TOPICS": "orders, payments"})
    assert settings.topics == ("orders", "payments")
    assert settings.web_host == "127.0.0.1"
    assert settings.incidents == "kdiv-incidents"
    assert settings.processing_guarantee == "at_least_once"

    settings = Settings.from_env(
        {
            "KDIV_TOPIC_PATTERN": r"orders\..*",
            "KDIV_APP_ID": "audit",
            "KDIV_COMPACTION_LAG_MS": "orders.eu=3600000, *=0",
            "KDIV_PROCESSING_GUARANTEE": "exactly_once",
            "KDIV_WEB_ENABLED": "false",
            "KDIV_MAX_AGE_MS": "86400000",
        }
    )
    assert settings.topic_pattern == re.compile(r"orders\..*")
    assert settings.compaction_lag_ms == {"orders.eu": 3_600_000, "*": 0}
    assert settings.incidents == "audit-incidents"
    assert settings.web_enabled is False
    assert settings.max_age_ms == 86_400_000
    assert Settings.from_env({"KDIV_TOPICS": "t", "KDIV_COMPACTION_LAG_MS": "5000"}).compaction_lag_ms == {"*": 5000}


def test_watches_names_or_pattern_never_kdiv_own_topics():
    by_name = Settings.from_env({"KDIV_TOPICS": "kdiv-demo"})
    assert by_name.watches("kdiv-demo")
    assert not by_name.watches("other")
    pattern = Settings.from_env({"KDIV_TOPIC_PATTERN": ".*"})
    assert pattern.watches("kdiv-demo")
    for own in ("kdiv-incidents", "kdiv-state-p8-changelog", "kdiv-__assignor-__leader", "__consumer_offsets"):
        assert not pattern.watches(own), own


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({}, "KDIV_TOPICS"),
        ({"KDIV_TOPICS": "a", "KDIV_TOPIC_PATTERN": "b"}, "KDIV_TOPIC_PATTERN"),
        ({"KDIV_TOPIC_PATTERN": "("}, "KDIV_TOPIC_PATTERN"),
        ({"KDIV_TOPICS": "a", "KDIV_WEB_PORT": "http"}, "KDIV_WEB_PORT"),
        ({"KDIV_TOPICS": "a", "KDIV_PROCESSING_GUARANTEE": "maybe"}, "KDIV_PROCESSING_GUARANTEE"),
        ({"KDIV_TOPICS": "a", "KDIV_COMPACTION_LAG_MS": "orders=soon"}, "KDIV_COMPACTION_LAG_MS"),
        ({"KDIV_TOPICS": "a", "KDIV_COMPACTION_LAG_MS": "orders=-1"}, "KDIV_COMPACTION_LAG_MS"),
        ({"KDIV_TOPICS": "a", "KDIV_WEB_ENABLED": "perhaps"}, "KDIV_WEB_ENABLED"),
        ({"KDIV_TOPICS": "a", "KDIV_SESSION_TIMEOUT_S": "0"}, "KDIV_SESSION_TIMEOUT_S"),
        (
            {"KDIV_TOPICS": "a", "KDIV_SESSION_TIMEOUT_S": "1", "KDIV_HEARTBEAT_INTERVAL_S": "0.5"},
            "KDIV_HEARTBEAT_INTERVAL_S",
        ),
        ({"KDIV_TOPICS": "a", "KDIV_MAX_AGE_MS": "-5"}, "KDIV_MAX_AGE_MS"),
        ({"KDIV_TOPICS": "a", "KDIV_UNVALIDATED_AFTER_S": "0"}, "KDIV_UNVALIDATED_AFTER_S"),
        ({"KDIV_TOPICS": "a", "KDIV_UNVALIDATED_AFTER_S": "nan"}, "KDIV_UNVALIDATED_AFTER_S"),
        ({"KDIV_TOPICS": "a", "KDIV_UNVALIDATED_AFTER_S": "inf"}, "KDIV_UNVALIDATED_AFTER_S"),
    ],
)
def test_bad_values_name_the_variable(env, named):
    with pytest.raises(SettingsError, match=named):
        Settings.from_env(env)
