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
