"""Make this starter your project: `./run new acme` renames the starter's project package
(the folder with settings.py, wsgi.py and asgi.py) to `acme`, and every reference to it
(settings module, wsgi/asgi, manage.py, compose, the Dockerfile, the env example, docs,
tests, scripts), and writes a local `.env` with a fresh DJANGO_SECRET_KEY (docker compose
reads it; it is git-ignored). With `--without-demo` it also drops the demo app: `demo/`, its
INSTALLED_APPS entry, `./run`'s `demo_setup` line and README's lines about them.

What it leaves alone: `ox/` (the reusable app, which names no project), `bench/results/*.json`
(benchmark runs as they were recorded, which the dashboard plots), and an existing `.env`. In a
git checkout the package is moved with `git mv`, so `git log --follow` keeps its history.

Standard library only: it runs before the project's virtualenv exists."""

import argparse
import keyword
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Spelled in two parts so that no rename rewrites it: a renamed tree's name may be a common
# word, which a second rename must not replace everywhere (it is refused: no such package).
OLD = "ox" + "project"
# Names a project package must not take: this tree's own top-level folders and modules, and
# what Django or the tests import by these names.
TAKEN = {"ox", "dashboard", "demo", "tests", "scripts", "bench", "templates", "staticfiles", "var", "docs", "django"}
SKIP_DIRS = {".git", ".venv", "var", "staticfiles", "__pycache__", ".pytest_cache", ".ruff_cache", "node_modules"}
SKIP_PREFIXES = ("bench/results/", "bench/.venv/", "ox/", "scripts/make_yours.py")


class Refused(Exception):
    pass


# What --without-demo edits besides deleting demo/: (file, pattern, what it is).
# Each pattern must match exactly once, or the tree is not the one these were written for and
# nothing is changed: a silent miss would leave a settings entry or a ./run line that breaks.
# `{package}` is the project package's folder.
DEMO_LINES = [
    ("{package}/settings.py", r'^[ \t]*"demo",[ \t]*\n', "its INSTALLED_APPS entry"),
    ("run", r"^(?:#[^\n]*\bdemo\b[^\n]*\n)?\$PY manage\.py demo_setup\b[^\n]*\n", "./run's demo_setup line"),
    ("README.md", r"\n\n`manage\.py demo_setup`[^\n]*(?:\n[^\n]+)*", "README's paragraph on demo_setup"),
    ("README.md", r"^demo/ [^\n]*\n", "README's layout line for demo/"),
]


def check_name(name: str) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise Refused(f"{name!r}: a project name is a Python package name: lowercase letters, digits, _")
    if keyword.iskeyword(name) or name in TAKEN or name in getattr(sys, "stdlib_module_names", ()):
        raise Refused(f"{name!r} is taken (a Python keyword, a module of the standard library, or a folder here)")
    if len(name) > 40:
        raise Refused(f"{name!r}: at most 40 characters (it names databases too)")


def files(root: Path, skip: tuple[str, ...] = ()) -> list[Path]:
    """The tree's files: git's list in a checkout (tracked and untracked, not ignored), else a walk."""
    try:
        out = subprocess.run(  # noqa: S603  (fixed arguments)
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],  # noqa: S607  (git from PATH)
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
        paths = [root / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
            paths += [Path(dirpath) / f for f in filenames]
    skip = SKIP_PREFIXES + skip
    return [p for p in paths if p.is_file() and not p.relative_to(root).as_posix().startswith(skip)]


def rewrite(path: Path, new: str) -> bool:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return False  # not text (a screenshot, a font)
    if OLD not in text:
        return False
    path.write_text(text.replace(OLD, new), encoding="utf-8")
    return True


def in_git(root: Path) -> bool:
    probe = ["git", "rev-parse", "--is-inside-work-tree"]
    return subprocess.run(probe, cwd=root, capture_output=True).returncode == 0  # noqa: S603, S607  (git from PATH)


def write_env(root: Path, new: str) -> str:
    env = root / ".env"
    if env.exists():
        return ".env exists: left as it is (set DJANGO_SECRET_KEY there yourself if it has none)"
    key = secrets.token_urlsafe(50)
    fd = os.open(env, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(
            f"# Written by ./run new {new}: this project's own secret key (docker compose reads this file).\n"
            f"DJANGO_SECRET_KEY={key}\nPOSTGRES_DB={new}\n"
        )
    return ".env written: a fresh DJANGO_SECRET_KEY, POSTGRES_DB (mode 0600, git-ignored)"


def check_demo(root: Path, git: bool) -> None:
    """Refuse --without-demo before anything changes unless each of its edits has its one place."""
    if not (root / "demo" / "apps.py").is_file():
        raise Refused("no demo/apps.py here: the demo app is gone already")
    if git:
        dirty = subprocess.run(  # noqa: S603  (fixed arguments)
            ["git", "status", "--porcelain", "--", "demo"],  # noqa: S607  (git from PATH)
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        if dirty:  # deleting it would lose work that is in no commit
            raise Refused("demo/ has changes that are not committed: commit or discard them first")
    for name, pattern, what in DEMO_LINES:
        path = root / name.format(package=OLD)
        found = len(re.findall(pattern, path.read_text(encoding="utf-8"), re.M)) if path.is_file() else 0
        if found != 1:
            raise Refused(f"--without-demo: {what} is not in {path.relative_to(root)} once but {found} times")


def drop_demo(root: Path, package: str, git: bool) -> str:
    for name, pattern, _what in DEMO_LINES:
        path = root / name.format(package=package)
        path.write_text(re.sub(pattern, "", path.read_text(encoding="utf-8"), count=1, flags=re.M), encoding="utf-8")
    demo = root / "demo"
    said = "with its INSTALLED_APPS entry, ./run's demo_setup line and README's lines on it"
    if not git:
        shutil.rmtree(demo)
        return f"demo/ deleted, {said}"
    subprocess.run(["git", "rm", "-r", "-q", "demo"], cwd=root, check=True)  # noqa: S603, S607
    # git rm leaves what git does not track: bytecode caches go (left alone, they keep demo/
    # importable as a namespace package), then the folders they leave empty; anything else
    # there is someone's own work and stays.
    for cache in sorted(demo.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache)
    for folder in sorted((d for d in [demo, *demo.rglob("*")] if d.is_dir()), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    left = " (demo/ still holds files git does not track: left as they are)" if demo.exists() else ""
    return f"demo/ removed (git rm), {said}{left}"


def make_yours(root: Path, new: str, without_demo: bool = False) -> list[str]:
    check_name(new)
    package = root / OLD
    if not (package / "settings.py").is_file():
        raise Refused(f"no {OLD}/settings.py here: already renamed, or not the starter's tree")
    if (root / new).exists():
        raise Refused(f"{new}/ exists already")
    git = in_git(root)
    if without_demo:
        check_demo(root, git)
    # The demo's files are not rewritten when they are about to go: the count is of what stays.
    going = ("demo/",) if without_demo else ()
    changed = [p.relative_to(root).as_posix() for p in files(root, going) if rewrite(p, new)]
    if git:
        # The name passed check_name: a package name, no option or path in it.
        subprocess.run(["git", "mv", OLD, new], cwd=root, check=True)  # noqa: S603, S607
    else:
        package.rename(root / new)
    dropped = [drop_demo(root, new, git)] if without_demo else []
    return [
        f"{OLD}/ is now {new}/; {len(changed)} files name {new} instead of {OLD}",
        *dropped,
        write_env(root, new),
        f"next: ./run (the dashboard and a worker), ./test; then commit: git add -A && git commit -m 'Start {new}'",
    ]


def main(argv: list[str] | None = None) -> int:
    # No abbreviations: `--without` must not pass for `--without-demo` (or for an option added later).
    parser = argparse.ArgumentParser(prog="./run new", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("name", help="the project's Python package name, e.g. acme")
    parser.add_argument(
        "--without-demo",
        action="store_true",
        help="also drop the demo app: demo/, its INSTALLED_APPS entry, ./run's demo_setup line",
    )
    args = parser.parse_args(argv)
    try:
        for line in make_yours(ROOT, args.name, without_demo=args.without_demo):
            print(line)
    except Refused as exc:
        print(f"./run new: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
