#!/usr/bin/env bash
# redis-acl.sh: give the Redis ACL users of deploy/redis/users.acl their
# passwords and turn them on.
#
#   scripts/redis-acl.sh passwords DIR USER...   create DIR/USER.pass (random, 0600) where missing
#   scripts/redis-acl.sh render ACL DIR          print ACL with every user that has DIR/USER.pass
#                                                turned on with that password's SHA-256 (never
#                                                the password itself); the others stay off
#   scripts/redis-acl.sh url DIR USER HOST:PORT/DB
#                                                print redis://USER:PASSWORD@HOST:PORT/DB
#
# The shipped file has every user off and no password: Redis can load it as
# it is, and then nobody can log in until a user is turned on.
set -euo pipefail

usage() {
	sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

cmd=${1:-}
case "$cmd" in
passwords)
	[ $# -ge 3 ] || usage
	dir=$2
	shift 2
	mkdir -p "$dir"
	chmod 0700 "$dir"
	for u in "$@"; do
		f="$dir/$u.pass"
		if [ ! -s "$f" ]; then
			(umask 077 && head -c 32 /dev/urandom | sha256sum | cut -c1-48 >"$f")
		fi
	done
	;;
render)
	[ $# -eq 3 ] || usage
	acl=$2 dir=$3
	while IFS= read -r line || [ -n "$line" ]; do
		read -r kw user state _ <<<"$line"
		if [ "$kw" = user ] && [ "$state" = off ] && [ -s "$dir/$user.pass" ]; then
			hash=$(tr -d '\n' <"$dir/$user.pass" | sha256sum | cut -d' ' -f1)
			line="user $user on #$hash ${line#"user $user off "}"
		fi
		printf '%s\n' "$line"
	done <"$acl"
	;;
url)
	[ $# -eq 4 ] || usage
	dir=$2 user=$3 hostport=$4
	[ -s "$dir/$user.pass" ] || { echo "no password for $user in $dir" >&2; exit 1; }
	printf 'redis://%s:%s@%s\n' "$user" "$(tr -d '\n' <"$dir/$user.pass")" "$hostport"
	;;
*) usage ;;
esac
