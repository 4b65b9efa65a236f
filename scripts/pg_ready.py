"""Exit 0 if the PostgreSQL server in the given URL answers (its database may not exist yet)."""

import sys
from urllib.parse import urlsplit

import psycopg

url = urlsplit(sys.argv[1])
try:
    psycopg.connect(
        host=url.hostname or "127.0.0.1",
        port=url.port or 5432,
        user=url.username or "postgres",
        password=url.password,
        dbname="postgres",
        connect_timeout=3,
    ).close()
except psycopg.Error:
    sys.exit(1)
