"""The docs say only what is true: each test reads a claim out of README.md, docs/deployment.md,
.env.example, docker-compose.yml or bench/README.md and checks it against the code, so that a
change on either side without the other fails here."""

import ast
import fnmatch
import io
import os
import re
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
from django.apps import apps
from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import BaseCommand, SystemCheckError
from django.test import override_settings

from ox import cron
from ox.conf import OxOptions
from ox.enqueue import enqueue_many
from ox.schedules import MISSED_POLICIES, Schedule
from tests.settings import DATABASES, TASKS

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DEPLOYMENT = (ROOT / "docs" / "deployment.md").read_text()
ENV_EXAMPLE = (ROOT / ".env.example").read_text()
COMPOSE = (ROOT / "docker-compose.yml").read_text()
BENCH_README = (ROOT / "bench" / "README.md").read_text()

# Where environment variables are read: the settings, the container entrypoint, and the
# scripts an operator or developer runs.
ENV_SOURCES = [
    *sorted((ROOT / "oxproject").glob("*.py")),
    ROOT / "scripts" / "docker-entrypoint.sh",
    ROOT / "scripts" / "bootstrap.sh",
    ROOT / "scripts" / "dashboard_scale.py",
    ROOT / "run",
    ROOT / "test",
    *sorted((ROOT / "ox").glob("*.py")),
]
# Read, but set by Python or Django themselves, not by an operator.
NOT_OPERATOR_VARIABLES = {"DJANGO_SETTINGS_MODULE"}


def table_rows(text: str) -> dict[str, list[str]]:
    """Markdown table rows keyed by their first cell's backticked name(s)."""
    rows = {}
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for name in re.findall(r"`([^`]+)`", cells[0]):
            rows[name] = cells
    return rows


ENV_ROWS = table_rows(DEPLOYMENT)


def env_variables_read() -> dict[str, str | None]:
    """Every variable the sources read, with its default where it is a literal."""
    found: dict[str, str | None] = {}
    patterns = [
        (r"os\.environ\.get\(\s*\"([A-Z][A-Z0-9_]*)\"(?:\s*,\s*\"([^\"]*)\")?", True),
        (r"os\.environ\[\"([A-Z][A-Z0-9_]*)\"\]", False),
        (r"os\.getenv\(\s*\"([A-Z][A-Z0-9_]*)\"(?:\s*,\s*\"([^\"]*)\")?", True),
        (r"env_bool\(\s*\"([A-Z][A-Z0-9_]*)\"\s*,\s*(True|False)\s*\)", True),
        (r"env_bool\(\s*\"([A-Z][A-Z0-9_]*)\"", False),
        (r"env_list\(\s*\"([A-Z][A-Z0-9_]*)\"\s*,\s*\"([^\"]*)\"\s*\)", True),
        (r"env_list\(\s*\"([A-Z][A-Z0-9_]*)\"\s*\)", False),
        (r"\$\{([A-Z][A-Z0-9_]*)(?::-([^}]*))?\}", True),
    ]
    for source in ENV_SOURCES:
        text = source.read_text()
        for pattern, has_default in patterns:
            for match in re.finditer(pattern, text):
                name = match.group(1)
                default = match.group(2) if has_default and match.lastindex and match.lastindex >= 2 else None
                if default in ("True", "False"):
                    default = "1" if default == "True" else "0"
                if found.get(name) is None:
                    found[name] = default
    # Positional script arguments (${1:-web}) match no name; the bench harness has its own README.
    return {k: v for k, v in found.items() if k not in NOT_OPERATOR_VARIABLES}


def test_the_scan_finds_the_variables_it_should():
    # The scan itself must work, or every test below would pass on an empty set.
    found = env_variables_read()
    assert {"DATABASE_URL", "OX_BIND", "OX_PYTHON", "OX_ADDR", "DJANGO_HSTS_INCLUDE_SUBDOMAINS"} <= set(found)
    assert found["CONN_MAX_AGE"] == "0" and found["GUNICORN_TIMEOUT"] == "30" and found["DATABASE_POOL"] == "0"


def test_every_environment_variable_read_is_in_env_example_and_the_docs():
    found = env_variables_read()
    in_example = set(re.findall(r"^(?:# )?([A-Z][A-Z0-9_]*)=", ENV_EXAMPLE, re.M))
    assert sorted(set(found) - in_example) == [], ".env.example lacks these"
    assert sorted(set(found) - set(ENV_ROWS)) == [], "docs/deployment.md's variable tables lack these"


def test_every_literal_default_is_the_documented_one():
    for name, default in env_variables_read().items():
        if default is None:
            continue
        cell = ENV_ROWS[name][1]
        if default == "":
            assert cell.startswith(("empty", "none")), (name, cell)
        else:
            assert cell.startswith(f"`{default}`"), (name, default, cell)


COMPOSE_SENTENCE = re.search(r"Compose passes these to the containers.*?:\n(.*?)\. It builds", DEPLOYMENT, re.S)


def compose_variables() -> dict[str, str | None]:
    """Variable -> its default under compose (None: no default, or a fixed value)."""
    passed: dict[str, str | None] = {}
    for match in re.finditer(r"^\s+([A-Z][A-Z0-9_]*): (.*)$", COMPOSE, re.M):
        name, value = match.groups()
        own = re.fullmatch(r"\$\{" + name + r"(?::-([^}]*)|:\?[^}]*)?\}", value.strip())
        passed[name] = own.group(1) if own else None
    for match in re.finditer(r"\$\{([A-Z][A-Z0-9_]*)(?::-([^}]*))?", COMPOSE):
        passed.setdefault(match.group(1), match.group(2))
    return passed


def test_every_variable_the_docs_say_compose_passes_is_passed():
    assert COMPOSE_SENTENCE, "docs/deployment.md: the 'Compose passes these' sentence is gone"
    said = set(re.findall(r"`([A-Z][A-Z0-9_]*)`", COMPOSE_SENTENCE.group(1)))
    passed = compose_variables()
    from_env = {n for n in passed if re.search(r"\$\{" + n + r"[:}]", COMPOSE)}
    assert sorted(said - from_env) == [], "the docs say compose passes these, docker-compose.yml does not"
    assert sorted(from_env - said) == [], "docker-compose.yml passes these, the docs do not say so"


def test_compose_defaults_are_documented():
    for name, default in compose_variables().items():
        if default is None or name not in ENV_ROWS:
            continue  # required, or fixed (OX_BIND), or a derived value (DATABASE_URL)
        cell = ENV_ROWS[name][1]
        shown = f"`{default}`" if default else "empty"
        assert shown in cell, (name, default, cell)
        if "compose:" in cell:
            assert f"compose: `{default}`" in cell, (name, default, cell)
    assert "0.0.0.0:8000" in ENV_ROWS["OX_BIND"][2]  # compose fixes it, the docs say so


def test_option_defaults_in_the_configuration_reference():
    rows = table_rows(DEPLOYMENT[DEPLOYMENT.index("### Backend OPTIONS") :])
    for f in fields(OxOptions):
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        assert f.name.upper() in rows, f"docs/deployment.md: no row for OPTIONS {f.name.upper()}"
        assert rows[f.name.upper()][1] == f"`{default!r}`", (f.name, default, rows[f.name.upper()])


def test_schedule_keys_aliases_and_missed_default_are_documented():
    periodic = DEPLOYMENT[DEPLOYMENT.index("### Periodic tasks") : DEPLOYMENT.index("### Retention")]
    for alias in cron.SHORTHANDS:
        assert f"`{alias}`" in periodic, alias
    assert f'`"{Schedule.missed}"` by default' in periodic
    for policy in MISSED_POLICIES:
        assert f'`"{policy}"`' in periodic, policy


def test_enqueue_many_batch_size_in_the_readme():
    import inspect

    batch = inspect.signature(enqueue_many).parameters["batch_size"].default
    assert f"batch_size={batch}" in README


def test_every_metric_is_in_the_metrics_table():
    source = (ROOT / "ox" / "metrics.py").read_text()
    names = set(re.findall(r"\"(ox_[a-z_]+)\"", source))
    assert "ox_metrics_window_seconds" in names
    documented = set(table_rows(DEPLOYMENT[DEPLOYMENT.index("| metric |") :]))
    assert sorted(names - documented) == []


def test_bench_readme_rescue_timing_matches_the_defaults():
    o = OxOptions()
    assert f"every {o.rescue_interval:g} s (`RESCUE_INTERVAL`)" in BENCH_README
    assert f"free for {o.liveness_grace:g} s (`LIVENESS_GRACE`)" in BENCH_README


# ---------------------------------------------------------------- management commands


def project_commands() -> dict[str, BaseCommand]:
    return {
        name: load_command_class(app, name)
        for name, app in get_commands().items()
        if app in ("ox", "demo", "dashboard")
    }


def own_options(command: BaseCommand, name: str) -> list:
    base = {a.dest for a in BaseCommand().create_parser("manage.py", name)._actions}
    return [a for a in command.create_parser("manage.py", name)._actions if a.dest not in base]


COMMANDS = ["runworker", "ox_health", "prune_tasks", "first_login", "ox_queue"]
# The demo app's: a project started with `./run new NAME --without-demo` has no demo app.
DEMO_COMMANDS = ["demo_setup"]


def needs_demo() -> None:
    if not apps.is_installed("demo"):
        pytest.skip("no demo app in INSTALLED_APPS (./run new NAME --without-demo)")


def test_the_project_commands_are_found():
    assert set(COMMANDS) <= set(project_commands())
    assert set(DEMO_COMMANDS) <= set(project_commands()) or not apps.is_installed("demo")


@pytest.mark.parametrize("name", COMMANDS + DEMO_COMMANDS)
def test_every_command_option_has_help_text_and_is_documented(name):
    if name in DEMO_COMMANDS:
        needs_demo()
    command = project_commands()[name]
    assert command.help
    docs = README + DEPLOYMENT
    for action in own_options(command, name):
        if not action.option_strings:  # a positional: its help is in `manage.py help NAME`
            assert action.help, f"{name} {action.dest} has no help text"
            continue
        flag = max(action.option_strings, key=len)
        assert action.help, f"{name} {flag} has no help text"
        assert flag in docs, f"{name} {flag} is not in README.md or docs/deployment.md"


def test_runworker_usage_shows_its_defaults():
    usage = re.search(r"manage\.py runworker (.*?)```", README, re.S).group(1)
    shown = dict(re.findall(r"\[(--[a-z-]+)(?: ([^\]]+))?\]", usage))
    command = project_commands()["runworker"]
    actions = {max(a.option_strings, key=len): a for a in own_options(command, "runworker")}
    assert set(shown) == set(actions)
    for flag, value in shown.items():
        if value and not value.isupper():  # QUEUES, N, SECONDS are placeholders
            assert value == str(actions[flag].default), (flag, value, actions[flag].default)


def test_first_login_creates_or_resets_the_staff_login_and_enqueues_nothing(db):
    from django.contrib.auth import get_user_model

    from ox.models import Task

    said = []
    for _ in range(2):  # the second run resets the password of the login the first made
        out = io.StringIO()
        call_command("first_login", "--username", "docs-login", "--addr", "127.0.0.1:8123", stdout=out)
        assert "is starting on http://127.0.0.1:8123/" in out.getvalue(), out.getvalue()
        said.append(re.search(r"staff login: docs-login / (\S+)", out.getvalue()).group(1))
    user = get_user_model().objects.get(username="docs-login")
    assert user.is_staff and user.is_superuser and said[0] != said[1]
    assert user.check_password(said[1]) and not user.check_password(said[0])
    assert not Task.objects.exists()


def test_demo_setup_enqueues_the_demo_tasks_and_says_which(db):
    needs_demo()
    from django.contrib.auth import get_user_model

    from ox.models import Task

    out = io.StringIO()
    call_command("demo_setup", stdout=out)
    assert "demo tasks enqueued: 5 add" in out.getvalue()
    # 10 tasks, and two workflows: the album (1 + 4 + 1) and the chain of adds (3).
    assert Task.objects.count() == 10 + 6 + 3 and Task.objects.filter(workflow_id__isnull=False).count() == 9
    assert "2 workflows" in out.getvalue()
    assert "staff login" not in out.getvalue() and not get_user_model().objects.exists()


# ---------------------------------------------------------------- system checks


BASE = TASKS["default"]


def tasks_with(options: dict, **params) -> dict:
    return {"default": {**BASE, "OPTIONS": options, **params}}


def sqlite_without_wal() -> dict:
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": "/tmp/x.sqlite3", "OPTIONS": {"timeout": 5}}


# One configuration per documented id that makes `manage.py check` report it.
MAKES = {
    "ox.E001": {"TASKS": tasks_with({"LEASE": -1})},
    "ox.E002": {"TASKS": tasks_with({"SCHEDULES": {"s": {"task": "tests.tasks.echo", "every": 5, "missed": "all"}}})},
    "ox.E003": {"TASKS": tasks_with({"SCHEDULES": {"s": {"task": "tests.tasks.echo", "cron": "61 * * * *"}}})},
    "ox.E004": {"TASKS": tasks_with({"SCHEDULES": {"s": {"task": "tests.tasks.missing", "every": 60}}})},
    "ox.E005": {"TASKS": tasks_with({"SCHEDULES": {"s": {"task": "tests.tasks.echo", "every": 60, "queue": "x"}}})},
    "ox.E006": {
        "TASKS": {
            **tasks_with({"SCHEDULES": {"s": {"task": "tests.tasks.echo", "every": 60}}}),
            "other": {**BASE, "OPTIONS": {"SCHEDULES": {"s": {"task": "tests.tasks.echo", "every": 60}}}},
        }
    },
    "ox.E007": {"TASKS": tasks_with({"DATABASE": "replica"})},
    "ox.E011": {"TASKS": tasks_with({"LIMITS": {"nowhere": {"concurrency": 1}}})},
    "ox.E008": {"USE_TZ": False},
    "ox.W001": {"DATABASES": {**DATABASES, "jobs": sqlite_without_wal()}, "TASKS": tasks_with({"DATABASE": "jobs"})},
    "ox.W002": {"TASKS": tasks_with({"PREFETCH": 10, "MAX_LOST": 1})},
    "ox.W003": {"TASKS": tasks_with({"HEARTBEAT": 15, "LEASE": 30})},
    "ox.W004": {"OX_METRICS_TOKEN": "short"},
    "ox.E009": {
        "DATABASES": {**DATABASES, "jobs": {**DATABASES["default"], "ENGINE": "django.db.backends.postgresql"}},
        "TASKS": tasks_with({"DATABASE": "jobs", "LISTEN_DATABASE": "direct"}),
    },
    "ox.E010": {
        "DATABASES": {**DATABASES, "jobs": sqlite_without_wal()},
        "TASKS": tasks_with({"DATABASE": "jobs", "POOLER": "transaction"}),
    },
    "ox.W005": {
        "DATABASES": {
            **DATABASES,
            "jobs": {
                **DATABASES["default"],
                "DISABLE_SERVER_SIDE_CURSORS": True,
                "ENGINE": "django.db.backends.postgresql",
                "OPTIONS": {"server_side_binding": True, "prepare_threshold": 5},
            },
        },
        "TASKS": tasks_with({"DATABASE": "jobs", "POOLER": "transaction"}),
    },
    "ox.W006": {
        "DATABASES": {
            **DATABASES,
            "jobs": {**DATABASES["default"], "ENGINE": "django.db.backends.postgresql", "OPTIONS": {}},
        },
        "TASKS": tasks_with({"DATABASE": "jobs", "POOLER": "transaction"}),
    },
    "ox.W008": {"TASKS": {**tasks_with({}), "keep": {**BASE, "OPTIONS": {"PRUNE": {"FAILED": None}}}}},
}


# Database checks (they read the database): made against real databases in their own tests.
MADE_ELSEWHERE = {"ox.W007": "tests/test_mariadb_charset.py::test_a_padding_database_is_reported_by_the_check"}


def documented_check_ids() -> list[str]:
    return sorted(set(re.findall(r"^\| `(ox\.[EW]\d{3})` \|", DEPLOYMENT, re.M)))


def check_output(**overrides) -> str:
    out, err = io.StringIO(), io.StringIO()
    with override_settings(**overrides):
        try:
            call_command("check", stdout=out, stderr=err)
        except SystemCheckError as exc:
            return str(exc) + err.getvalue()
    return out.getvalue() + err.getvalue()


def test_every_documented_check_id_has_a_configuration_here():
    assert documented_check_ids() == sorted([*MAKES, *MADE_ELSEWHERE])


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.parametrize("check_id", documented_check_ids())
def test_manage_py_check_reports_each_documented_id(check_id, db):
    if check_id in MADE_ELSEWHERE:
        pytest.skip(f"a database check: {MADE_ELSEWHERE[check_id]}")
    output = check_output(**MAKES[check_id])
    assert f"({check_id})" in output, output
    assert "Traceback" not in output


def test_manage_py_check_is_clean_on_the_test_settings(db):
    assert "(ox." not in check_output()


# ---------------------------------------------------------------- settings


def test_database_pool_forces_conn_max_age_to_zero():
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "oxproject.settings",
        "DATABASE_URL": "postgres://u@127.0.0.1:5432/x",
        "CONN_MAX_AGE": "60",
        "DJANGO_DEBUG": "1",  # settings need no secret key then
    }
    script = (
        "from django.conf import settings as s; d = s.DATABASES['default'];"
        " print(d['CONN_MAX_AGE'], d.get('OPTIONS', {}).get('pool'))"
    )
    run = lambda **extra: subprocess.run(  # noqa: E731
        [sys.executable, "-c", script], env={**env, **extra}, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert run(DATABASE_POOL="1").stdout.split() == ["0", "True"]
    assert run(DATABASE_POOL="0").stdout.split() == ["60", "None"]


def test_the_metrics_token_setting_wins_over_the_environment_variable(client, db, monkeypatch):
    monkeypatch.setenv("OX_METRICS_TOKEN", "from-the-environment-variable")
    bearer = lambda token: client.get("/ox/metrics", headers={"Authorization": f"Bearer {token}"})  # noqa: E731
    with override_settings(OX_METRICS_TOKEN="from-the-django-setting"):
        assert bearer("from-the-django-setting").status_code == 200
        assert bearer("from-the-environment-variable").status_code == 401
    with override_settings(OX_METRICS_TOKEN=""):
        assert bearer("from-the-environment-variable").status_code == 200


# ---------------------------------------------------------------- README


def test_layout_names_every_ox_module():
    layout = README[README.index("## Layout") :]
    modules = sorted(p.name for p in (ROOT / "ox").glob("*.py") if p.name != "__init__.py")
    missing = [m for m in modules if not re.search(rf"(?<![\w.]){re.escape(m)}\b", layout)]
    assert missing == []


def test_only_the_modules_the_layout_names_run_raw_sql():
    layout = README[README.index("## Layout") :]
    runs_sql = sorted(
        p.name for p in (ROOT / "ox").glob("*.py") if re.search(r"\.execute\(|executemany\(|\.copy\(", p.read_text())
    )
    # Table health, the backlog count and the worker session's settings are their drivers'
    # (ox/db/*/health.py, session.py): a database's own SQL lives in its driver.
    said = {"periodic.py", "prune.py", "clock.py", "vacuum.py"}
    assert set(runs_sql) == said
    # The drivers are where the worker's statements live: every module of theirs runs SQL
    # but the shared rows and walks, which only build it.
    drivers = {str(p.relative_to(ROOT / "ox" / "db")) for p in (ROOT / "ox" / "db").rglob("*.py")}
    runs = {d for d in drivers if re.search(r"\.execute\(|\.copy\(", (ROOT / "ox" / "db" / d).read_text())}
    builds_only = {"__init__.py", "rows.py", "walks.py", "indexes.py", "postgresql/claim.py", "postgresql/join.py"}
    assert drivers - runs == builds_only
    assert "db/" in layout and "the drivers" in layout
    assert "each runs its own SQL" in layout and "in SQL" in layout and "its own session" in layout
    assert "one SELECT of its own" in layout and "backlog counts in SQL of its own" in layout


def test_ox_imports_nothing_from_dashboard():
    for path in (ROOT / "ox").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("dashboard"), path
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("dashboard") for a in node.names), path


def test_functions() -> dict[str, set[str]]:
    found = {}
    for path in (ROOT / "tests").glob("test_*.py"):
        tree = ast.parse(path.read_text())
        found[path.name] = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    return found


test_functions.__test__ = False  # a helper, not a test


def promise_bullets() -> list[str]:
    section = README[README.index("What the worker promises") : README.index("## The dashboard")]
    return [b for b in re.split(r"\n(?=- \*\*)", section) if b.startswith("- **")]


def test_every_promise_names_tests_that_exist():
    functions = test_functions()
    bullets = promise_bullets()
    assert len(bullets) >= 9
    for bullet in bullets:
        refs = re.findall(r"(test_\w+\.py)?(?:::(test_[\w*]+))?", bullet)
        refs = [(f, t) for f, t in refs if f or t]
        assert refs, f"names no test: {bullet[:60]}"
        current = None
        for file, test in refs:
            current = file or current
            assert current in functions, (current, bullet[:60])
            if test:
                assert fnmatch.filter(functions[current], test), f"{current}::{test} does not exist"
