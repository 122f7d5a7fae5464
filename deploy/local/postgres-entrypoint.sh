#!/bin/sh
# First start: initdb with the superuser's password from POSTGRES_PASSWORD_FILE, the flags in
# POSTGRES_INITDB_ARGS, password logins from any address and the database POSTGRES_DB, as the
# registry's postgres image does; every start: the server as the postgres account, listening on
# every address of the container.
set -eu
PGDATA=${PGDATA:-/var/lib/postgresql/data}
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  cat "${POSTGRES_PASSWORD_FILE:?POSTGRES_PASSWORD_FILE must name the superuser password file}" > "$pwfile"
  chown postgres "$pwfile"
  # shellcheck disable=SC2086  # the flags are words, as the registry's image splits them
  as_postgres initdb -D "$PGDATA" -U postgres --pwfile="$pwfile" -E UTF8 --locale=C.UTF-8 ${POSTGRES_INITDB_ARGS:-}
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  if [ -n "${POSTGRES_DB:-}" ] && [ "$POSTGRES_DB" != postgres ]; then
    echo "CREATE DATABASE \"$POSTGRES_DB\";" | as_postgres postgres --single -D "$PGDATA" postgres > /dev/null
  fi
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA" -c listen_addresses='*'
