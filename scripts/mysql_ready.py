"""Exit 0 if the MariaDB/MySQL server in the given URL answers; 2 if mysqlclient (the driver
Django's MySQL backend uses) is not installed."""

import sys
from urllib.parse import urlsplit

try:
    import MySQLdb
except ImportError:
    sys.exit(2)

url = urlsplit(sys.argv[1])
try:
    MySQLdb.connect(
        host=url.hostname or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        connect_timeout=3,
    ).close()
except MySQLdb.Error:
    sys.exit(1)
