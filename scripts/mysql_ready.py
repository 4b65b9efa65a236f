"""Exit 0 if the MariaDB/MySQL server in the given URL answers (creating the URL's database if
it is missing: Django's checks on MySQL connect to it, the test databases are made beside
it); 2 if mysqlclient (the driver Django's MySQL backend uses) is not installed."""

import sys
from urllib.parse import urlsplit

try:
    import MySQLdb
except ImportError:
    sys.exit(2)

url = urlsplit(sys.argv[1])
name = url.path.lstrip("/")
try:
    conn = MySQLdb.connect(
        host=url.hostname or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        connect_timeout=3,
    )
    if name:
        conn.cursor().execute(
            f"CREATE DATABASE IF NOT EXISTS `{name.replace('`', '``')}` CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"
        )
    conn.close()
except MySQLdb.Error:
    sys.exit(1)
