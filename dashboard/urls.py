from django.urls import path

from dashboard.views import actions, benchmarks, health, overview, running, tasks, workers

app_name = "dashboard"
urlpatterns = [
    path("", overview.overview, name="overview"),
    path("tasks/", tasks.task_list, name="tasks"),
    path("tasks/bulk/", actions.bulk, name="bulk"),
    path("tasks/retry-matching/", actions.retry_matching, name="retry_matching"),
    path("tasks/<uuid:pk>/", tasks.task_detail, name="task"),
    path("tasks/<uuid:pk>/retry/", actions.act_on_task, {"action": "retry"}, name="retry"),
    path("tasks/<uuid:pk>/cancel/", actions.act_on_task, {"action": "cancel"}, name="cancel"),
    path("running/", running.running, name="running"),
    path("workers/", workers.workers, name="workers"),
    path("health/", health.health, name="health"),
    path("benchmarks/", benchmarks.benchmarks, name="benchmarks"),
]
