"""Run the matrix: create each arm's database, then for every cell and repetition run one
agent per arm, arms in rotating order, keeping every sample; write the results file after
every cell; print the table."""

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

from bench import envinfo, procs, report
from bench.agent import RESULT_MARK
from bench.arms import ARM_NAMES, ARMS, python_for
from bench.plan import Cell, Metric, build

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
VAR = BENCH / "var"
SCHEMA = 1


INFRA_ERRORS = (
    "terminating connection due to administrator command",
    "the database system is shutting down",
    "the database system is starting up",
    "connection refused",
    "server closed the connection unexpectedly",
)


def infrastructure_failure(error: str) -> bool:
    return any(marker in error for marker in INFRA_ERRORS)


class Harness:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.mode = "quick" if args.quick else "full"
        self.arms = [a for a in ARM_NAMES if not args.arms or a in args.arms.split(",")]
        self.pg_base = args.pg_url.rstrip("/")
        self.my_base = getattr(args, "mariadb_url", "mysql://root@127.0.0.1:3306").rstrip("/")
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        self.run_id = f"{stamp}-{self.mode}"
        self.out = Path(args.out) if args.out else BENCH / "results" / f"{self.run_id}.json"
        self.logs = VAR / "logs" / self.run_id
        plan = build(self.mode)
        if args.cells:
            wanted = set(args.cells.split(","))
            plan = [c for c in plan if c.name in wanted]
        self.plan = plan
        self.doc: dict[str, Any] = {}

    # ---------------------------------------------------------------- databases
    def db_url(self, arm: str, db: str) -> str:
        if db == "sqlite":
            return f"sqlite:///{VAR / 'sqlite' / (ARMS[arm][2] + '.sqlite3')}"
        if db == "mariadb":
            return f"{self.my_base}/{ARMS[arm][2]}"
        return f"{self.pg_base}/{ARMS[arm][2]}"

    def create_databases(self) -> None:
        """Fresh databases for every run: PostgreSQL ones dropped and created, SQLite files removed."""
        with psycopg.connect(f"{self.pg_base}/postgres", autocommit=True, connect_timeout=5) as conn:
            for arm in self.arms:
                name = sql.Identifier(ARMS[arm][2])
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
                conn.execute(sql.SQL("CREATE DATABASE {}").format(name))
        if any(c.db == "mariadb" for c in self.plan):
            self.create_mariadb_databases()
        (VAR / "sqlite").mkdir(parents=True, exist_ok=True)
        for arm in self.arms:
            for suffix in ("", "-wal", "-shm"):
                Path(self.db_url(arm, "sqlite").removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)

    def create_mariadb_databases(self) -> None:
        try:
            import MySQLdb
        except ImportError:
            raise SystemExit("MariaDB cells need mysqlclient in bench/.venv (libmariadb-dev to build)") from None
        url = urlsplit(self.my_base)
        conn = MySQLdb.connect(
            host=url.hostname or "127.0.0.1",
            port=url.port or 3306,
            user=url.username or "root",
            password=url.password or "",
            connect_timeout=5,
        )
        try:
            cursor = conn.cursor()
            for arm in self.arms:
                name = ARMS[arm][2]
                cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
                # oxproject's MariaDB database: utf8mb4, binary collation (docs/databases.md)
                cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin")
        finally:
            conn.close()

    # ---------------------------------------------------------------- agents
    def agent(self, arm: str, job: str, params: dict[str, Any], db: str, timeout: float, label: str) -> dict:
        """Run one job in a fresh process with the arm's settings. On timeout the agent and
        every process it started are killed by pid."""
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": ARMS[arm][0], "BENCH_DB_URL": self.db_url(arm, db)}
        env.pop("DATABASE_URL", None)
        log_dir = self.logs / label
        log_dir.mkdir(parents=True, exist_ok=True)
        payload = json.dumps({"arm": arm, "job": job, "params": {**params, "log_dir": str(log_dir)}})
        with open(log_dir / "agent.log", "ab") as err:
            agent = subprocess.Popen(  # noqa: S603
                [python_for(arm, sys.executable), "-m", "bench.agent", payload],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
            )
            try:
                out, _ = agent.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                procs.end_agent(agent)
                return {"ok": False, "error": f"agent timed out after {timeout:.0f} s"}
        for line in reversed(out.decode(errors="replace").splitlines()):
            if line.startswith(RESULT_MARK):
                return json.loads(line[len(RESULT_MARK) :])
        return {"ok": False, "error": f"agent exited {agent.returncode} without a result; see {log_dir}/agent.log"}

    # ---------------------------------------------------------------- the run
    def prepare(self) -> None:
        self.create_databases()
        environment = envinfo.collect(f"{self.pg_base}/postgres")
        dbs = sorted({c.db for c in self.plan} | {"pg"})
        arms_info: dict[str, Any] = {}
        for arm in self.arms:
            arms_info[arm] = {}
            for db in dbs:
                if db != "pg" and not any(c.db == db and arm in c.arms for c in self.plan):
                    continue  # no cell of this arm on that database
                res = self.agent(arm, "setup", {}, db, 300, f"setup-{arm}-{db}")
                if not res["ok"]:
                    raise SystemExit(f"setting up {arm} on {db} failed:\n{res['error']}")
                arms_info[arm][db] = res["result"]["info"]
        environment["arms"] = arms_info
        self.doc = {
            "schema": SCHEMA,
            "run_id": self.run_id,
            "started_at": datetime.now(UTC).isoformat(),
            "finished_at": None,
            **envinfo.git_info(),
            "mode": self.mode,
            "arms": self.arms,
            "environment": environment,
            "options": {
                "argv": sys.argv[1:],
                "order": "arms rotate per repetition (and per cell), so no arm always runs first",
                "database_urls": {a: {db: self.db_url(a, db) for db in dbs} for a in self.arms},
                "plan": [asdict(c) for c in self.plan],
            },
            "cells": [],
            "runs": [],
        }

    def run_cell(self, index: int, cell: Cell) -> None:
        arms = [a for a in self.arms if a in cell.arms]
        # Selected arms that do not run this cell say why (in the printout and in the results),
        # rather than going missing from it.
        cannot = {a: why for a, why in cell.cannot_run.items() if a in self.arms and a not in arms}
        for arm, why in cannot.items():
            print(f"  {arm}: {why}")
        if not arms:
            print("  (no selected arm runs this cell)")
            if cannot:
                for metric in cell.metrics:
                    self.doc["cells"].append({**self.cell_entry(cell, metric), "cannot_run": cannot})
            return
        samples: dict[str, dict[str, list[float]]] = {a: {} for a in arms}
        for rep in range(cell.reps):
            shift = (index + rep) % len(arms)
            for arm in arms[shift:] + arms[:shift]:
                label = f"{cell.name}-{rep}-{arm}"
                print(f"  {label} ...", end="", flush=True)
                started = time.monotonic()
                res = self.agent(arm, cell.job, cell.params, cell.db, cell.timeout, label)
                retried = None
                if not res["ok"] and infrastructure_failure(res.get("error") or ""):
                    # The database went away under us (a restart by someone else on a shared
                    # machine): not the arm's doing. One retry; the first error is kept.
                    retried = res["error"]
                    time.sleep(3)
                    res = self.agent(arm, cell.job, cell.params, cell.db, cell.timeout, label + "-retry")
                seconds = time.monotonic() - started
                print(f" {seconds:.1f} s{'' if res['ok'] else ' FAILED'}", flush=True)
                result = res.get("result") or {}
                self.doc["runs"].append(
                    {
                        "cell": cell.name,
                        "rep": rep,
                        "arm": arm,
                        # ox is developed while it is measured: which source this run saw.
                        "ox_tree_sha1": envinfo.ox_tree_sha1(),
                        "seconds": seconds,
                        "ok": res["ok"],
                        "error": res.get("error"),
                        "retried_after": retried,
                        "result": result,
                    }
                )
                for metric in cell.metrics:
                    value = result.get(metric.key)
                    if value is None:
                        continue
                    kept = samples[arm].setdefault(metric.key, [])
                    kept.extend(value if isinstance(value, list) else [value])
        for metric in cell.metrics:
            entry = self.cell_entry(cell, metric)
            if cannot:
                entry["cannot_run"] = cannot
            for arm in arms:
                kept = samples[arm].get(metric.key, [])
                entry["arms"][arm] = {"samples": kept, "value": report.summarize(kept, metric.stat)}
            ours = entry["arms"].get(report.OURS, {}).get("value")
            entry["ratios"] = {a: report.ratio(ours, entry["arms"][a]["value"]) for a in arms if a != report.OURS}
            self.doc["cells"].append(entry)

    @staticmethod
    def cell_entry(cell: Cell, metric: Metric) -> dict[str, Any]:
        """A metric's entry in the results' cells, before any arm's values."""
        entry: dict[str, Any] = {
            "name": cell.name,
            "metric": metric.name,
            "unit": metric.unit,
            "higher_is_better": metric.higher_is_better,
            "stat": metric.stat,
            "db": cell.db,
            "about": cell.about,
            "arms": {},
            "ratios": {},
        }
        if cell.series is not None:
            name, axis, x = cell.series
            entry["series"] = {"name": name, "axis": axis, "x": x}
        return entry

    def write(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=str) + "\n")
        tmp.replace(self.out)

    def run(self) -> None:
        print(f"oxproject bench, {self.mode} mode: {len(self.plan)} cells, arms {', '.join(self.arms)}")
        started = time.monotonic()
        self.prepare()
        for index, cell in enumerate(self.plan):
            print(f"[{index + 1}/{len(self.plan)}] {cell.name}: {cell.about}", flush=True)
            self.run_cell(index, cell)
            self.write()
        trees = sorted({run["ox_tree_sha1"] for run in self.doc["runs"]} | {self.doc["ox_tree_sha1"]})
        self.doc["ox_trees_seen"] = trees
        self.doc["finished_at"] = datetime.now(UTC).isoformat()
        self.doc["environment"]["load_average_end"] = envinfo.load_average()
        self.doc["environment"]["duration_s"] = time.monotonic() - started
        self.write()
        print()
        print(report.table(self.doc))
        for block in report.series_tables(self.doc):
            print()
            print(block)
        for line in report.notes(self.doc):
            print("note:", line)
        print(f"\nresults: {self.out.relative_to(REPO) if self.out.is_relative_to(REPO) else self.out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench", description="ox against its peers (see bench/README.md)")
    parser.add_argument("--quick", action="store_true", help="small sizes, fewer cells (about three to four minutes)")
    parser.add_argument("--cells", default="", help="comma-separated cell names to run (default: the whole plan)")
    parser.add_argument("--arms", default="", help=f"comma-separated subset of {','.join(ARM_NAMES)}")
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432"))
    parser.add_argument("--mariadb-url", default=os.environ.get("BENCH_MARIADB_URL", "mysql://root@127.0.0.1:3306"))
    parser.add_argument("--out", default="", help="results file (default: bench/results/<utc time>-<mode>.json)")
    parser.add_argument("--report", metavar="FILE", help="print the table of an existing results file and exit")
    parser.add_argument("--ci", action="store_true", help="CI's subset, compared with bench/baselines/ci.json")
    parser.add_argument("--write-baseline", action="store_true", help="with --ci: write the baseline from this run")
    parser.add_argument("--baseline", default="", help="with --ci: the baseline file (default bench/baselines/ci.json)")
    args = parser.parse_args(argv)
    if args.write_baseline and not args.ci:
        parser.error("--write-baseline goes with --ci")
    if args.ci:
        from bench import ci  # it builds on this module's Harness

        raise SystemExit(ci.main(args))
    if args.report:
        doc = json.loads(Path(args.report).read_text())
        print(report.table(doc))
        for block in report.series_tables(doc):
            print()
            print(block)
        for line in report.notes(doc):
            print("note:", line)
        return
    Harness(args).run()
