"""ox OPTIONS POOLER and LISTEN_DATABASE: validation, the listener they pick, and the system
checks of contradictory or risky pooling settings (no PgBouncer needed; tests/test_pgbouncer.py
runs one)."""

import pytest


@pytest.mark.django_db(transaction=False)
def test_pooler_options_are_validated_and_pick_the_listener():
    from django.core.exceptions import ImproperlyConfigured

    from ox.conf import OxOptions

    assert OxOptions.from_dict({}).listen_alias("default") == "default"
    assert OxOptions.from_dict({"POOLER": "session"}).listen_alias("default") == "default"
    pooled = OxOptions.from_dict({"POOLER": "transaction"})
    assert pooled.pooled and pooled.listen_alias("default") is None
    direct = OxOptions.from_dict({"POOLER": "transaction", "LISTEN_DATABASE": "direct"})
    assert direct.listen_alias("default") == "direct"
    assert OxOptions.from_dict({"POOLER": "transaction", "NOTIFY": False}).listen_alias("default") is None
    for bad, message in [
        ({"POOLER": "statement"}, "POOLER must be one of"),
        ({"LISTEN_DATABASE": ""}, "LISTEN_DATABASE must be a DATABASES alias"),
        ({"LISTEN_DATABASE": "direct", "NOTIFY": False}, "NOTIFY is off"),
        ({"POOLER": "transaction", "DATABASE": "jobs", "LISTEN_DATABASE": "jobs"}, "LISTEN needs a direct"),
    ]:
        with pytest.raises(ImproperlyConfigured, match=message):
            OxOptions.from_dict(bad)


def check_ids(databases: dict[str, dict[str, object]], options: dict[str, object]) -> list[str]:
    from django.test import override_settings

    from ox.checks import check_pooling
    from tests.settings import TASKS

    with override_settings(DATABASES=databases, TASKS={"default": {**TASKS["default"], "OPTIONS": options}}):
        return sorted(m.id for m in check_pooling())


@pytest.mark.django_db(transaction=False)
@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_pooling_checks():
    pg = {"ENGINE": "django.db.backends.postgresql", "NAME": "ox", "DISABLE_SERVER_SIDE_CURSORS": True}
    lite = {"ENGINE": "django.db.backends.sqlite3", "NAME": "/tmp/x.sqlite3"}
    pooled = {"POOLER": "transaction"}
    assert check_ids({"default": pg}, pooled) == []
    assert check_ids({"default": pg, "direct": pg}, {**pooled, "LISTEN_DATABASE": "direct"}) == []
    assert check_ids({"default": pg}, {**pooled, "LISTEN_DATABASE": "direct"}) == ["ox.E009"]
    assert check_ids({"default": pg}, {**pooled, "LISTEN_DATABASE": "default"}) == ["ox.E009"]
    assert check_ids({"default": lite}, pooled) == ["ox.E010"]
    assert check_ids({"default": pg, "direct": lite}, {"LISTEN_DATABASE": "direct"}) == ["ox.E010"]
    risky = {**pg, "OPTIONS": {"server_side_binding": True, "prepare_threshold": 5}}
    assert check_ids({"default": risky}, pooled) == ["ox.W005"]
    assert check_ids({"default": risky}, {}) == []  # not pooled: prepared statements are fine
    assert check_ids({"default": {**pg, "OPTIONS": {"prepare_threshold": 5}}}, pooled) == []  # client binding
    assert check_ids({"default": {**pg, "DISABLE_SERVER_SIDE_CURSORS": False}}, pooled) == ["ox.W006"]
