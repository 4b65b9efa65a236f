"""The celery arm's Celery application, as Celery's "First steps with Django" sets one up: the
settings module named in DJANGO_SETTINGS_MODULE (bench.settings_celery), configuration from its
CELERY_* settings. `python -m celery -A bench.celery_app worker ...` runs its workers; Celery's
Django fixup calls django.setup() in them."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings_celery")

app = Celery("bench", include=["bench.celery_tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")
