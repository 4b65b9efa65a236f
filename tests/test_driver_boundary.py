"""One driver per database (issue 12): what differs between databases lives in its driver
under ox/db/, so adding a database is adding a driver module and a CI leg. Pinned here by
source: outside ox/db/ (and the migrations, which are per database by Django's design) no
module of ox reads a connection's `.vendor` to choose what to do."""

import ast
from pathlib import Path

from django.db import connection

from ox.db import DRIVERS, driver
from ox.db.base import Driver

OX = Path(__file__).resolve().parent.parent / "ox"

# Where `.vendor` may still be read outside ox/db/, and why: not a branch.
IDENTITIES = {
    ("clock.py", "_identity"),  # part of a cache key naming one database; the same clock for every vendor
}


def vendor_reads() -> set[tuple[str, str, int]]:
    """(module, enclosing function, line) of every `.vendor` read outside ox/db/ and migrations."""
    found = set()
    for path in sorted(OX.rglob("*.py")):
        relative = path.relative_to(OX)
        if relative.parts[0] in ("db", "migrations"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for function in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]:
            name = getattr(function, "name", "<module>")
            for node in ast.walk(function):
                if isinstance(node, ast.Attribute) and node.attr == "vendor":
                    found.add((str(relative), name, node.lineno))
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "getattr" and len(node.args) > 1:
                    if isinstance(node.args[1], ast.Constant) and node.args[1].value == "vendor":
                        found.add((str(relative), name, node.lineno))
    # A read inside a function is also seen from the module and from any enclosing function:
    # keep the innermost name for each line.
    innermost: dict[tuple[str, int], str] = {}
    for module, name, line in sorted(found, key=lambda f: f[1] == "<module>"):
        innermost.setdefault((module, line), name)
    return {(module, name, line) for (module, line), name in innermost.items()}


def test_no_module_outside_the_drivers_branches_on_the_vendor():
    reads = vendor_reads()
    stray = sorted(r for r in reads if (r[0], r[1]) not in IDENTITIES)
    assert stray == [], "ask the driver (ox.db.driver(conn)) instead of reading conn.vendor"
    # The allowance is still used (else it should go), and the scan does see reads.
    assert {(module, name) for module, name, _line in reads} == IDENTITIES


def test_the_base_driver_has_the_generic_answers():
    """A database without a driver override gets no session tuning, no table health, the ORM's
    backlog count and no collation problems: what a new driver starts from."""
    base = Driver()
    options: dict[str, object] = {"x": 1}
    assert base.worker_options(options, pooled=False, idle_limit=60.0) is None
    assert options == {"x": 1}
    assert base.table_health(connection, 3600.0, "ox_task") is None
    assert base.backlog_rows(connection, None, 1) is None  # type: ignore[arg-type]
    assert base.collation_problems(connection) == []


def test_every_driver_is_found_by_its_vendor():
    assert set(DRIVERS) == {"postgresql", "sqlite", "mysql"}
    assert driver(connection) is DRIVERS[connection.vendor]
