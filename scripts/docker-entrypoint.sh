#!/bin/sh
# The container commands, also run as they are by tests/test_production.py outside Docker.
#   web     check --deploy, migrate, collectstatic, then gunicorn on $OX_BIND (default 127.0.0.1:8000;
#           the image sets 0.0.0.0:8000, a container's own interface)
#   worker  manage.py runworker with $OX_WORKER_PROCESSES processes of $OX_WORKER_CONCURRENCY threads
#   migrate migrations only (a one-off job before a rolling upgrade)
#   anything else runs as given (e.g. `docker compose run web python manage.py createsuperuser`)
set -eu
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"

case "${1:-web}" in
  web)
    # Refuse to serve with settings that `check --deploy` warns about (DEBUG on, a weak key,
    # cookies without Secure, no HSTS, ...), before anything else runs. An operator accepts a
    # warning deliberately, by id: DJANGO_SILENCED_CHECKS=security.W008,...
    "$PYTHON" manage.py check --deploy --fail-level WARNING
    if [ "${OX_MIGRATE_ON_START:-1}" = "1" ]; then
      "$PYTHON" manage.py migrate --no-input
    fi
    "$PYTHON" manage.py collectstatic --no-input -v 0
    # exec: gunicorn becomes this process, so `docker stop` (SIGTERM) reaches it directly.
    exec "$PYTHON" -m gunicorn oxproject.wsgi:application \
      --bind "${OX_BIND:-127.0.0.1:8000}" \
      --workers "${WEB_CONCURRENCY:-2}" \
      --timeout "${GUNICORN_TIMEOUT:-30}" \
      --access-logfile - \
      --forwarded-allow-ips "${FORWARDED_ALLOW_IPS:-127.0.0.1}"  # also what settings trust (OX_TRUSTED_PROXIES)
    ;;
  worker)
    shift
    # Word splitting of OX_WORKER_ARGS is wanted: extra flags, e.g. "--queues default,emails".
    # shellcheck disable=SC2086
    exec "$PYTHON" manage.py runworker \
      --processes "${OX_WORKER_PROCESSES:-2}" \
      --concurrency "${OX_WORKER_CONCURRENCY:-4}" \
      ${OX_WORKER_ARGS:-} "$@"
    ;;
  migrate)
    exec "$PYTHON" manage.py migrate --no-input
    ;;
  *)
    exec "$@"
    ;;
esac
