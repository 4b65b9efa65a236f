from django.urls import path

from dashboard.views import actions, benchmarks, health, overview, queues, running, tasks, workers, workflows

app_name = "dashboard"
urlpatterns = [
    path("", overview.overview, name="overview"),
    path("tasks/", tasks.task_list, name="tasks"),
    path("tasks/bulk/", actions.bulk, name="bulk"),
    path("tasks/retry-matching/", actions.retry_matching, name="retry_matching"),
    path("tasks/<uuid:pk>/", tasks.task_detail, name="task"),
    path("tasks/<uuid:pk>/retry/", actions.act_on_task, {"action": "retry"}, name="retry"),
    path("tasks/<uuid:pk>/cancel/", actions.act_on_task, {"action": "cancel"}, name="cancel"),
    path("queues/", queues.queue_list, name="queues"),
    # The queue's name is a POST field, not a path segment: any name a queue may have fits.
    path("queues/pause/", queues.pause_or_resume, {"action": "pause"}, name="pause"),
    path("queues/resume/", queues.pause_or_resume, {"action": "resume"}, name="resume"),
    path("queues/limit/", queues.limit, name="limit"),
    path("running/", running.running, name="running"),
    path("workflows/", workflows.workflow_list, name="workflows"),
    path("workflows/<uuid:pk>/", workflows.workflow_detail, name="workflow"),
    path("workflows/<uuid:pk>/retry/", workflows.retry_workflow, name="retry_workflow"),
    path("workers/", workers.workers, name="workers"),
    path("health/", health.health, name="health"),
    path("benchmarks/", benchmarks.benchmarks, name="benchmarks"),
]
