from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

urlpatterns = [
    # Log in and out only: Django's password-reset views would let anyone have mail sent to any
    # address (and tell known addresses from unknown ones by timing). Staff change their own
    # password in the admin; an administrator resets others' there or with changepassword.
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("ox/", include("ox.urls")),
    path("", include("dashboard.urls")),
]
