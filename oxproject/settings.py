"""oxproject settings: DATABASE_URL picks the database, an SQLite file is the default."""

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.utils.csp import CSP

from oxproject import security

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("OX_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


# Off unless asked for: a server started without being told is a production server. ./run and
# the test settings turn it on explicitly.
DEBUG = env_bool("DJANGO_DEBUG", False)
# var/ holds the SQLite database and the local key: this user's only (0700).
security.private_dir(VAR_DIR)
# With DEBUG off the key must be set and look like a secret (no placeholder, 50+ characters, not
# a pattern); with DEBUG on and none set, a random one is kept in var/secret_key.
SECRET_KEY = security.secret_key(os.environ.get("DJANGO_SECRET_KEY", ""), DEBUG, VAR_DIR)

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS")

# The proxies whose forwarded headers are believed: the same FORWARDED_ALLOW_IPS that gunicorn
# reads (scripts/docker-entrypoint.sh passes it on). Gunicorn sets the request's scheme from
# X-Forwarded-Proto only when the peer is one of these, so Django's SECURE_PROXY_SSL_HEADER,
# which would believe the header from anyone who can reach the port, is not set; login
# throttling reads X-Forwarded-For only from these (oxproject.security.client_ip).
OX_TRUSTED_PROXIES = security.networks(os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1"))

# Behind HTTPS (on by default with DEBUG off): cookies are sent over HTTPS only, plain HTTP is
# redirected, HSTS is sent.
SECURE = env_bool("DJANGO_SECURE", not DEBUG)
HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", False)
HSTS_PRELOAD = env_bool("DJANGO_HSTS_PRELOAD", False)
if SECURE:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SSL_REDIRECT", True)
    # A year, what browsers' preload lists ask for; lower it while trying HTTPS out.
    SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = HSTS_INCLUDE_SUBDOMAINS
    SECURE_HSTS_PRELOAD = HSTS_PRELOAD
# Pages read the CSRF token from the template (forms, htmx's hx-headers), never the cookie.
CSRF_COOKIE_HTTPONLY = True

# `check --deploy` runs before gunicorn starts and fails on any warning: an operator silences
# one deliberately, by id (DJANGO_SILENCED_CHECKS=security.W008,...). includeSubDomains and
# preload are options (they bind every subdomain, and preload is slow to undo), so their
# "not set" warnings are silenced while they are off.
SILENCED_SYSTEM_CHECKS = [
    *env_list("DJANGO_SILENCED_CHECKS"),
    *([] if HSTS_INCLUDE_SUBDOMAINS else ["security.W005"]),
    *([] if HSTS_PRELOAD else ["security.W021"]),
]

# Content-Security-Policy on every response (Django's own middleware): scripts and styles only
# from our static files (htmx and Chart.js are vendored), no inline script, no eval, no framing.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF],
    "connect-src": [CSP.SELF],
    "font-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}

# Login throttling (django-axes): after OX_LOGIN_FAILURE_LIMIT wrong passwords for one username
# from one address, that pair is refused for OX_LOGIN_COOLOFF_MINUTES, right password or not.
# Keyed on the pair, so nobody elsewhere can lock a colleague out by guessing at their name.
AXES_FAILURE_LIMIT = int(os.environ.get("OX_LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=float(os.environ.get("OX_LOGIN_COOLOFF_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "oxproject.security.client_ip"
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out pair before any password check
    "django.contrib.auth.backends.ModelBackend",
]

# DEBUG's technical 500 page and error mails hide database URLs too.
DEFAULT_EXCEPTION_REPORTER_FILTER = "oxproject.errors.ExceptionReporterFilter"

# Prometheus scrapes /ox/metrics with "Authorization: Bearer <token>" (empty: the session of
# staff with ox.view_task only).
OX_METRICS_TOKEN = os.environ.get("OX_METRICS_TOKEN", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "django_filters",
    "axes",
    "ox",
    "dashboard",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "oxproject.middleware.RejectNulCharacters",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it turns a refused login into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "oxproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "oxproject.wsgi.application"
ASGI_APPLICATION = "oxproject.asgi.application"

# SQLite is shared by the web process and the workers: WAL lets readers run beside the one
# writer, IMMEDIATE takes the write lock at BEGIN (no upgrade deadlocks), and the busy timeout
# makes a writer wait its turn instead of failing with "database is locked".
SQLITE_OPTIONS = {
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    "transaction_mode": "IMMEDIATE",
    "timeout": 30,
}

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}"),
        conn_max_age=int(os.environ.get("CONN_MAX_AGE", "0")),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {**SQLITE_OPTIONS, **DATABASES["default"].get("OPTIONS", {})}
    # The file holds sessions: this user's only (0600) before SQLite first opens it.
    _sqlite_file = Path(DATABASES["default"]["NAME"])
    if DATABASES["default"]["NAME"] != ":memory:" and _sqlite_file.parent.is_dir():
        security.private_file(_sqlite_file)
    # Tests run workers as subprocesses: they need a file, not an in-memory database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
elif DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    # All of Unicode (utf8mb4; MariaDB's utf8 is three bytes), binary comparison (queue
    # names and keys compare as on PostgreSQL), and READ COMMITTED (each statement sees what
    # others committed before it: ox.flow.gate counts after its lock).
    DATABASES["default"]["OPTIONS"] = {
        "charset": "utf8mb4",
        "isolation_level": "read committed",
        **DATABASES["default"].get("OPTIONS", {}),
    }
    DATABASES["default"]["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_nopad_bin"}
elif env_bool("DATABASE_POOL", False):
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TASKS = {
    "default": {
        "BACKEND": "ox.backend.OxBackend",
        "QUEUES": ["default", "emails", "reports"],
        "OPTIONS": {},
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("DJANGO_STATIC_ROOT", BASE_DIR / "staticfiles"))
# whitenoise scans STATIC_ROOT at start-up and warns when it is missing (before collectstatic).
STATIC_ROOT.mkdir(parents=True, exist_ok=True)

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"

# OX_LOG_FORMAT=json: one JSON object per line (time, level, logger, message, task_id, ...).
LOG_FORMAT = os.environ.get("OX_LOG_FORMAT", "plain")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "oxproject.logging.JsonFormatter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "json" if LOG_FORMAT == "json" else "plain"}
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "ox": {"level": os.environ.get("OX_LOG_LEVEL", "INFO")},
        # Django's own "django" logger prints to the console under DEBUG too: log task events
        # once, through our handler.
        "django.tasks": {"level": "WARNING", "handlers": ["console"], "propagate": False},
    },
}

# whitenoise serves the collected static files (htmx, chart.js, the dashboard's CSS/JS) from
# gunicorn, gzip/brotli-compressed. With DEBUG off, the manifest variant: content-hashed names
# that browsers may cache forever (collectstatic must have run: the entrypoint does). With DEBUG
# on, the plain one, so tests and runserver render templates without collectstatic.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
