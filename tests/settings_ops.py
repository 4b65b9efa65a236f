"""tests.settings plus backend OPTIONS from the OX_TEST_OPTIONS environment variable (JSON),
so worker subprocesses can run with schedules or pruning."""

import json
import os

from tests.settings import *  # noqa: F403
from tests.settings import TASKS

TASKS = {
    "default": {
        **TASKS["default"],
        "OPTIONS": {**TASKS["default"]["OPTIONS"], **json.loads(os.environ.get("OX_TEST_OPTIONS", "{}"))},
    }
}
