# oxproject: one image for the web (gunicorn) and the workers (manage.py runworker).
FROM python:3.13-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_DEBUG=0 \
    DJANGO_STATIC_ROOT=/app/staticfiles \
    OX_VAR_DIR=/app/var \
    OX_BIND=0.0.0.0:8000

WORKDIR /app

# Dependencies first: this layer is rebuilt only when requirements.txt changes.
COPY requirements.txt .
RUN pip install -r requirements.txt

RUN useradd --create-home --uid 10001 ox
COPY --chown=ox:ox . .
RUN mkdir -p /app/staticfiles /app/var && chown ox:ox /app/staticfiles /app/var
USER ox

EXPOSE 8000
ENTRYPOINT ["/app/scripts/docker-entrypoint.sh"]
CMD ["web"]
