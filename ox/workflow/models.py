"""A workflow's own tables (ox.workflow): the workflow, and the edges between its tasks. The
tasks themselves are ox_task rows with workflow_id set."""

from django.db import models

from ox.ids import uuid7


class Policy(models.TextChoices):
    # A task failed for good: its followers (transitively) are cancelled...
    STOP = "stop"
    # ...or they run all the same, the failed task's result standing as None.
    CONTINUE = "continue"


class Workflow(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    name = models.CharField(max_length=200, blank=True, default="")
    policy = models.CharField(max_length=10, choices=Policy.choices, default=Policy.STOP)
    # The on-failure task as enqueued when the first of the workflow's tasks fails for good
    # ({"task_path", "queue", "priority", "args", "kwargs", "max_attempts", "is_async"}).
    on_failure = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    # Set by the transaction that recorded the first final failure: it alone enqueues the
    # on-failure task (the row's lock decides, however many failures race).
    failed_at = models.DateTimeField(null=True, blank=True)
    handler_id = models.UUIDField(null=True, blank=True)  # the on-failure task, once enqueued

    class Meta:
        db_table = "ox_workflow"
        indexes = [models.Index(fields=["created_at"], name="ox_workflow_created")]

    def __str__(self) -> str:
        return f"workflow {self.name or self.id}"


class Edge(models.Model):
    """parent -> child: the child waits for the parent. When the parent finishes, the
    transaction that records it marks the edge done and copies the parent's result here (the
    child reads its inputs from its edges, wherever the parent's row has gone since)."""

    workflow_id = models.UUIDField()
    parent_id = models.UUIDField()
    child_id = models.UUIDField()
    position = models.PositiveIntegerField()  # the parent's place in the child's input list
    # The child gets all its parents' results as a list (after a group) rather than its one
    # parent's result (after a single task).
    gather = models.BooleanField(default=False)
    done = models.BooleanField(default=False)
    result = models.TextField(null=True, blank=True)  # the parent's return value, as JSON

    class Meta:
        db_table = "ox_workflow_edge"
        indexes = [
            models.Index(fields=["parent_id"], name="ox_edge_parent"),
            models.Index(fields=["child_id", "position"], name="ox_edge_child"),
            models.Index(fields=["workflow_id"], name="ox_edge_workflow"),
        ]

    def __str__(self) -> str:
        return f"{self.parent_id} -> {self.child_id}"
