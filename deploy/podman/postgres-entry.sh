#!/bin/sh
# postgres-entry.sh: what the official image's entry point does for compose.
# On an empty data directory: initdb with POSTGRES_USER as the superuser and
# POSTGRES_PASSWORD as its password (read from a file that is removed, never
# from argv), password logins from the network, and POSTGRES_DB created.
# Then PostgreSQL in the foreground, listening on every address.
set -eu
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
	pwfile=$(mktemp)
	printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
	initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
	rm -f "$pwfile"
	echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
	pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
	if [ "$db" != postgres ]; then
		createdb -U "$user" "$db"
	fi
	pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
	echo "postgres-entry: initialized $PGDATA (database $db, owner $user)"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*'
