#!/usr/bin/env bash
# CI only: make a MariaDB server answer at 127.0.0.1:3306 as root with an empty password, and
# give mysqlclient what it builds against. Installs the server if it is missing, starts it if
# it is stopped; a fresh Debian server's root logs in by unix socket only, so it is given
# the empty password too (this is a throwaway CI machine).
set -euo pipefail
need=()
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
pkg-config --exists libmariadb 2>/dev/null || need+=(libmariadb-dev)
[ -x /usr/sbin/mariadbd ] || need+=(mariadb-server)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
answers() { mariadb -h 127.0.0.1 -P 3306 -u root --connect-timeout=3 -e 'SELECT 1' >/dev/null 2>&1; }
answers && exit 0
if ! mariadb -u root -e 'SELECT 1' >/dev/null 2>&1; then  # not running at all
  service mariadb start >/dev/null 2>&1 || (mysqld_safe >/dev/null 2>&1 &)
  for _ in $(seq 1 60); do mariadb -u root -e 'SELECT 1' >/dev/null 2>&1 && break; sleep 1; done
fi
answers || mariadb -u root -e \
  "ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')" || true
answers
