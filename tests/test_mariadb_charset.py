"""MariaDB: the collation check (ox.W007) asks the server how a collation compares, against
real databases made with each collation a team may have."""

import uuid

import pytest
from django.core.management import call_command
from django.db import connection, connections

from ox.checks import check_mysql_collation
from ox.db.mysql.charset import collation_problems

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB/MySQL collations"),
]


@pytest.fixture
def database_with():
    made = []

    def make(charset: str, collation: str, ox_table_collation: str | None = None):
        name = f"oxcoll_{uuid.uuid4().hex[:10]}"
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET {charset} COLLATE {collation}")
            if ox_table_collation:
                cursor.execute(
                    f"CREATE TABLE `{name}`.ox_task (queue varchar(64))"
                    f" CHARACTER SET utf8mb4 COLLATE {ox_table_collation}"
                )
        conn = type(connections[connection.alias])({**connection.settings_dict, "NAME": name}, alias="ox_coll")
        made.append((name, conn))
        return conn

    yield make
    for name, conn in made:
        conn.close()
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE `{name}`")


@pytest.mark.parametrize(
    ("charset", "collation", "expected"),
    [
        ("utf8mb4", "utf8mb4_nopad_bin", []),
        ("utf8mb4", "utf8mb4_bin", ["pads"]),
        ("utf8mb4", "utf8mb4_general_ci", ["pads", "ignores case"]),
        ("utf8mb4", "utf8mb4_general_nopad_ci", ["ignores case"]),
        ("utf8mb3", "utf8mb3_general_ci", ["is not utf8mb4"]),
        ("latin1", "latin1_swedish_ci", ["is not utf8mb4"]),
    ],
)
def test_each_collation_is_judged_by_how_it_compares(database_with, charset, collation, expected):
    problems = collation_problems(database_with(charset, collation))
    assert len(problems) == len(expected)
    for problem, words in zip(problems, expected, strict=True):
        assert words in problem and collation in problem


def test_the_ox_tables_collation_wins_over_the_databases_default(database_with):
    """Tables made before keep their collation: a database altered to nopad_bin afterwards
    still holds a padding ox_task."""
    assert collation_problems(database_with("utf8mb4", "utf8mb4_nopad_bin", "utf8mb4_bin"))
    assert not collation_problems(database_with("utf8mb4", "utf8mb4_general_ci", "utf8mb4_nopad_bin"))


def test_the_test_database_passes_and_the_check_runs_with_check_database(capsys):
    assert collation_problems(connection) == []
    assert check_mysql_collation(databases=["default"]) == []
    call_command("check", "--database", "default")
    assert "ox.W007" not in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_a_padding_database_is_reported_by_the_check(database_with, settings):
    conn = database_with("utf8mb4", "utf8mb4_bin")
    settings.DATABASES = {**settings.DATABASES, "ox_coll": conn.settings_dict}
    settings.TASKS = {"default": {"BACKEND": "ox.backend.OxBackend", "OPTIONS": {"DATABASE": "ox_coll"}}}
    connections["ox_coll"] = conn
    try:
        messages = check_mysql_collation(databases=["ox_coll"])
    finally:
        del connections["ox_coll"]
    assert [m.id for m in messages] == ["ox.W007"]
    assert "pads" in messages[0].msg
