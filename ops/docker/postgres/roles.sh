#!/usr/bin/env bash
# The postgres service's command (docker-compose.yml): starts the image's own entrypoint (on
# the first start it creates POSTGRES_USER, the owner of the tables, and POSTGRES_DB), then gives
# the owner its password from .env again and makes a LOGIN role per component, named as
# libs/common db_roles.py names them (<owner>_producer, _aggregator, _worker, _user), with its
# password from .env (POSTGRES_ROLE_<COMPONENT>_PASSWORD). The grants are bootstrap's
# (db_roles.apply). Idempotent: every start sets the same passwords; a changed one takes
# effect at the next start. The passwords go to psql on stdin, never on a command line. The
# healthcheck waits for /tmp/roles-ready, so bootstrap and the services start once the roles exist.
set -euo pipefail
rm -f /tmp/roles-ready
docker-entrypoint.sh postgres -c max_connections=200 &
server=$!
# Over TCP: during first-start initialisation the server listens on its socket only.
until pg_isready -q -h 127.0.0.1 -p 5432 -U "$POSTGRES_USER" -d "$POSTGRES_DB"; do
  kill -0 "$server" 2>/dev/null || exit 1
  sleep 1
done
literal() { local s=${1//\'/\'\'}; printf "'%s'" "$s"; }
ident() { local s=${1//\"/\"\"}; printf '"%s"' "$s"; }
{
  echo "SET password_encryption = 'scram-sha-256';"
  echo "ALTER ROLE $(ident "$POSTGRES_USER") PASSWORD $(literal "$POSTGRES_PASSWORD");"
  for component in producer aggregator worker user; do
    var="POSTGRES_ROLE_${component^^}_PASSWORD"
    role="${POSTGRES_USER}_${component}"
    echo "DO \$\$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $(literal "$role")) THEN CREATE ROLE $(ident "$role"); END IF; END \$\$;"
    echo "ALTER ROLE $(ident "$role") LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD $(literal "${!var:?$var is not set}");"
  done
} | psql -v ON_ERROR_STOP=1 -q -U "$POSTGRES_USER" -d "$POSTGRES_DB" >/dev/null
touch /tmp/roles-ready
wait "$server"
