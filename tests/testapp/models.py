from django.db import models


class Ledger(models.Model):
    """One row per execution of a test task: counts runs from the database, not from memory."""

    key = models.CharField(max_length=64, db_index=True)
    pid = models.IntegerField()
    attempt = models.IntegerField(default=0)

    class Meta:
        app_label = "testapp"


class Account(models.Model):
    name = models.CharField(max_length=64)

    class Meta:
        app_label = "testapp"


class Span(models.Model):
    """When a test task's body started and ended (time.time()), for the flow-control tests'
    ledger of what ran at once and how starts spread."""

    key = models.CharField(max_length=64, db_index=True)
    group = models.CharField(max_length=200, blank=True, default="")
    pid = models.IntegerField()
    started = models.FloatField()
    ended = models.FloatField(null=True)

    class Meta:
        app_label = "testapp"
