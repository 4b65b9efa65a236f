"""One job for one arm, in a process of its own: `python -m bench.agent '<json>'`.

The harness starts an agent per (cell, repetition, arm) with DJANGO_SETTINGS_MODULE naming
the arm's settings, so the three systems never share a Python process, an app registry or a
database. The agent prints exactly one line starting with RESULT_MARK: the job's JSON.
"""

import json
import sys
import traceback
from importlib import import_module

RESULT_MARK = "BENCH-RESULT "


def main() -> None:
    job = json.loads(sys.argv[1])
    from bench.procs import become_subreaper

    # Orphans of a worker that died come to this process, not init: the harness's timeout
    # (procs.kill_tree) and each job's stop still find them, so none outlives the agent.
    become_subreaper()
    try:
        import django

        django.setup()
        from bench import jobs, producers, scale
        from bench.arms import load

        registry = {**jobs.JOBS, **scale.JOBS, **producers.JOBS}
        arm = load(job["arm"])
        if job["job"] in arm.job_overrides:  # an arm that is not a Django backend (pgqueuer)
            module, name = arm.job_overrides[job["job"]].split(":")
            registry[job["job"]] = getattr(import_module(module), name)
        result = registry[job["job"]](arm, job.get("params", {}))
        out = {"ok": True, "result": result}
    except Exception:  # report every failure to the harness, which records it and goes on
        out = {"ok": False, "error": traceback.format_exc()}
    sys.stdout.write(RESULT_MARK + json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
