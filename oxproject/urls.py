from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("ox/", include("ox.urls")),
    path("", include("dashboard.urls")),
]
