# lib.sh: small helpers shared by the scripts in this folder. Sourced, not run.

# step prints a progress line to stderr.
step() { printf '\033[1;34m==>\033[0m %s\n' "$*" >&2; }

# die prints an error and exits.
die() {
	printf '\033[1;31merror:\033[0m %s\n' "$*" >&2
	exit 1
}

# wait_for NAME TRIES CMD...: run CMD every 0.1 s until it succeeds, at most TRIES times.
wait_for() {
	local name=$1 tries=$2
	shift 2
	local i
	for ((i = 0; i < tries; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	die "$name did not come up (tried: $*)"
}

# test_services: export REDIS_URL and DATABASE_URL for tests. When either is
# unset, the test profile of services.sh provides both (installing Debian
# packages and starting the servers if needed); otherwise only the packages
# the tests run (sshd, ansible, ...) are made sure of.
test_services() {
	local services
	services="$(dirname "${BASH_SOURCE[0]}")/services.sh"
	if [ -z "${REDIS_URL:-}" ] || [ -z "${DATABASE_URL:-}" ]; then
		"$services" start test
		eval "$("$services" env test)"
	else
		"$services" deps
	fi
	export REDIS_URL DATABASE_URL
}
