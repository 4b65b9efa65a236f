from django.urls import path

from ox.metrics import metrics_view

app_name = "ox"
urlpatterns = [
    path("metrics", metrics_view, name="metrics"),
]
