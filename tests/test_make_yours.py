"""`./run new acme` (scripts/make_yours.py) on a fresh clone of this repository: the project
package and every reference to it renamed, a local .env with a fresh secret key, and a tree
whose checks, migrations and a slice of its own test suite (docs, settings, a real worker) pass
under its new name; and the same with `--without-demo`, which drops the demo app too. The clone
is of what is committed (HEAD); the project's virtualenv is borrowed, since building one is the
set-up's business (tests/test_run_script.py)."""

import ast
import os
import re
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Spelled in two parts, as in scripts/make_yours.py, so that the rename leaves it as it is: in a
# renamed tree these tests have no starter to rename (a second rename is refused), and skip.
STARTER = "ox" + "project"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (ROOT / STARTER / "settings.py").is_file(), reason="this tree is renamed already"),
]


def sh(cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a command in a session of its own; past `timeout`, that session's processes are
    stopped (by its process group: a `./run` that went on to start its servers starts them in
    groups of their own, so they are looked up by their working directory too)."""
    proc = subprocess.Popen(
        list(args), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            try:
                if Path(f"/proc/{pid}/cwd").resolve() == cwd.resolve():
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        out, err = proc.communicate()
        raise AssertionError(f"{args} did not finish within {timeout} s: {out[-1000:]}{err[-1000:]}") from None
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def fresh_tree(where: Path) -> Path:
    """This checkout as a clean clone would have it, with what is not committed yet: the
    files git knows or would (not the ignored ones), in a new repository of their own."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, where / name)
    for args in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start"],
    ):
        subprocess.run(["git", *args], cwd=where, check=True, capture_output=True, timeout=120)
    return where


def rename(tmp_path_factory, *options: str) -> Path:
    tree = fresh_tree(tmp_path_factory.mktemp("clone"))
    done = sh(tree, "./run", "new", "acme", *options)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "oxproject/ is now acme/" in done.stdout and ".env written" in done.stdout
    assert ("demo/ removed" in done.stdout) == ("--without-demo" in options), done.stdout
    (tree / ".venv").symlink_to(ROOT / ".venv")
    return tree


@pytest.fixture(scope="module")
def renamed(tmp_path_factory) -> Path:
    return rename(tmp_path_factory)


@pytest.fixture(scope="module")
def renamed_without_demo(tmp_path_factory) -> Path:
    return rename(tmp_path_factory, "--without-demo")


@pytest.fixture(params=["renamed", "renamed_without_demo"])
def tree(request) -> Path:
    """Each renamed tree in turn, for what holds of both."""
    return request.getfixturevalue(request.param)


def test_nothing_names_oxproject_but_the_recorded_benchmark_runs(tree):
    found = sh(tree, "git", "grep", "-n", "oxproject", "--", ".", ":!bench/results")
    assert found.returncode == 1 and found.stdout == "", found.stdout[:2000]  # 1: no match
    assert not (tree / "oxproject").exists() and (tree / "acme" / "settings.py").is_file()
    assert 'DJANGO_SETTINGS_MODULE", "acme.settings"' in (tree / "manage.py").read_text()
    assert "acme.wsgi:application" in (tree / "scripts" / "docker-entrypoint.sh").read_text()
    assert (tree / "README.md").read_text().startswith("# acme\n")


def test_the_package_moved_with_its_history(tree):
    lines = sh(tree, "git", "status", "--porcelain").stdout.splitlines()
    assert any(re.fullmatch(r"R. oxproject/settings\.py -> acme/settings\.py", line) for line in lines), lines
    assert not any(line.endswith(" .env") for line in lines)  # git-ignored


def test_without_demo_the_demo_app_is_gone_and_nothing_names_it_as_code(renamed_without_demo):
    tree = renamed_without_demo
    assert not (tree / "demo").exists() and (ROOT / "demo" / "apps.py").is_file()
    lines = sh(tree, "git", "status", "--porcelain").stdout.splitlines()
    assert "D  demo/apps.py" in lines and "D  demo/management/commands/demo_setup.py" in lines, lines
    # What breaks without the app: an import of it, an app entry, a ./run line. Every Python
    # file tracked is parsed, so an import anywhere (indented, `import os, demo`) is found.
    for name in sh(tree, "git", "ls-files", "*.py").stdout.split():
        for node in ast.walk(ast.parse((tree / name).read_text(), name)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            modules += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [m for m in modules if m == "demo" or m.startswith("demo.")], (name, modules)
    entry = sh(tree, "git", "grep", "-n", "-E", r"""^\s*["']demo(\.apps\.\w+)?["'],?\s*$""")
    assert entry.returncode == 1, entry.stdout  # 1: no match
    assert "demo" not in (tree / "run").read_text() and "demo" not in (tree / "acme" / "settings.py").read_text()
    assert "$PY manage.py first_login" in (tree / "run").read_text()
    # What may remain are words: README's lines on --without-demo itself, docs' and ox's
    # examples of task paths (demo.tasks.add, strings no one imports), comments, and tests of
    # the demo that skip without it. README's own first-run and layout lines on it are gone.
    readme = (tree / "README.md").read_text()
    assert "demo" not in readme[readme.index("## Two commands") : readme.index("## Using it")]
    assert "\ndemo/ " not in readme and "\ndashboard/ " in readme


def test_a_local_env_with_a_fresh_private_key(tree):
    env = tree / ".env"
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    values = dict(line.split("=", 1) for line in env.read_text().splitlines() if line and not line.startswith("#"))
    assert values["POSTGRES_DB"] == "acme" and len(values["DJANGO_SECRET_KEY"]) >= 50
    assert values["DJANGO_SECRET_KEY"] not in (ROOT / ".env.example").read_text()


def test_the_renamed_tree_checks_migrates_and_passes_its_own_tests(tree, tmp_path):
    env = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "OX_TEST_OPTIONS")
    }
    env |= {"DJANGO_DEBUG": "1", "OX_VAR_DIR": str(tmp_path / "var")}
    py = str(tree / ".venv" / "bin" / "python")
    for args in (
        ["check", "--fail-level", "WARNING"],
        ["makemigrations", "--check", "--dry-run"],
        ["migrate", "-v", "0"],
    ):
        done = sh(tree, py, "manage.py", *args, env=env)
        assert done.returncode == 0, (args, done.stdout + done.stderr)
    demo = sh(tree, py, "manage.py", "help", "demo_setup", env=env)
    assert (demo.returncode == 0) == (tree / "demo").exists(), demo.stdout + demo.stderr
    done = sh(
        tree,
        py,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "tests/test_docs.py",
        "tests/test_security_settings.py",
        "tests/test_worker.py::test_batch_worker_drains_and_exits_zero",
        "tests/test_make_yours.py",  # skips: no starter left to rename
        "-rs",
        env={**env, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "this tree is renamed already" in done.stdout, done.stdout[-3000:]
    # Without the demo app its tests skip, and only they: each says why.
    skipped = re.findall(r"SKIPPED \[(\d+)\] [^\n]*no demo app in INSTALLED_APPS", done.stdout)
    assert sum(map(int, skipped)) == (0 if (tree / "demo").exists() else 2), done.stdout[-3000:]


@pytest.fixture
def started():
    runs: list = []
    yield runs
    for run in runs:
        if run.proc.poll() is None or not run._file.closed:
            run.stop()


def test_run_in_the_renamed_tree_serves_the_dashboard_and_runs_the_demo_if_kept(tree, tmp_path, started):
    from ox.models import Status
    from tests.test_run_script import RunScript, free_port, get, run_env, wait_for_login_page

    port = free_port()
    run = RunScript(run_env(tmp_path, f"127.0.0.1:{port}"), tmp_path / "run.log", tree=tree)
    started.append(run)
    wait_for_login_page(run, port)
    assert "acme is starting on" in run.output() and "staff login: admin / " in run.output()
    status, body = get(f"http://127.0.0.1:{port}/no-such-page/")
    assert status == 404 and b"acme.urls" in body  # DEBUG's page names the URLconf: the renamed one
    db = tmp_path / "var" / "db.sqlite3"

    def tasks(where: str = "", *params: str) -> int:
        with sqlite3.connect(db) as conn:
            return conn.execute(f"SELECT count(*) FROM ox_task {where}", params).fetchone()[0]

    def until(done, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not done():
            assert time.monotonic() < deadline and run.proc.poll() is None, run.output()
            time.sleep(0.5)

    if (tree / "demo").exists():
        until(lambda: tasks("WHERE status = ?", Status.SUCCESSFUL) > 0, 60)
    else:
        # The worker is up and polling; ./run enqueued nothing before it, and for a few seconds
        # nothing appears (the demo's tasks would have been enqueued before the servers started).
        until(lambda: "worker started" in run.output(), 60)
        assert "demo tasks enqueued" not in run.output()
        for _ in range(6):
            assert tasks() == 0 and run.proc.poll() is None, run.output()
            time.sleep(0.5)
    assert run.stop() == 0, run.output()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["Acme"], "lowercase"),
        (["my-site"], "lowercase"),
        (["1st"], "lowercase"),
        (["class"], "taken"),
        (["json"], "taken"),
        (["ox"], "taken"),
        (["dashboard"], "taken"),
        (["a" * 41], "40 characters"),
        (["demo", "--without-demo"], "taken"),
        (["acme", "--with-demo"], "unrecognized arguments: --with-demo"),
        (["acme", "--without"], "unrecognized arguments: --without"),  # no abbreviations
        (["acme", "--without-demo=yes"], "ignored explicit argument"),
    ],
)
def test_a_bad_name_or_option_is_refused_and_nothing_changes(tmp_path, args, says):
    tree = tmp_path / "t"
    tree.mkdir()
    fresh_tree(tree)
    done = sh(tree, sys.executable, "scripts/make_yours.py", *args)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert sh(tree, "git", "status", "--porcelain").stdout == ""


def test_without_demo_refuses_to_delete_uncommitted_work_in_it(tmp_path):
    tree = tmp_path / "t"
    tree.mkdir()
    fresh_tree(tree)
    with (tree / "demo" / "tasks.py").open("a") as f:
        f.write("# a change of one's own\n")
    done = sh(tree, sys.executable, "scripts/make_yours.py", "acme", "--without-demo")
    assert done.returncode == 2 and "not committed" in done.stderr, done.stderr
    assert sh(tree, "git", "status", "--porcelain").stdout == " M demo/tasks.py\n"


def test_a_second_rename_is_refused(renamed):
    """acme may be a word used elsewhere in the team's code by then: replacing it everywhere
    would break what is not the project's name. Renaming again is a refactoring of one's own."""
    done = sh(renamed, "./run", "new", "other")
    assert done.returncode == 2 and "already renamed" in done.stderr
    assert (renamed / "acme" / "settings.py").is_file() and not (renamed / "other").exists()
