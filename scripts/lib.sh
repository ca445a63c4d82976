# lib.sh: small helpers shared by the scripts in this folder. Sourced, not run.

# step prints a progress line to stderr.
step() { printf '\033[1;34m==>\033[0m %s\n' "$*" >&2; }

# die prints an error and exits.
die() {
	printf '\033[1;31merror:\033[0m %s\n' "$*" >&2
	exit 1
}

# ensure_dev_null restores /dev/null to mode 0666 when something left it
# otherwise, after which initdb (as postgres) and every unprivileged
# `>/dev/null` fail. The cause seen (ansible-galaxy, run as root by tests,
# chmod'ed its token path /dev/null to 0600; services/infra/internal/sources
# now gives it a file of its own, and TestGalaxyCollectionRole watches
# /dev/null) is fixed; this stays a net for tests that run as root, and
# says so when it mends it.
ensure_dev_null() {
	local mode
	mode=$(stat -c %a /dev/null 2>/dev/null) || return 0
	if [ "$mode" != 666 ] && [ "$(id -u)" -eq 0 ]; then
		printf '\033[1;33mwarning:\033[0m /dev/null had mode %s; set back to 666\n' "$mode" >&2
		chmod 666 /dev/null
	fi
}

# guard_dev_null: until the calling script exits, keep /dev/null's mode
# 0666: scripts/devnull-guard.py mends it the moment it changes (inotify);
# without python3, a loop of ensure_dev_null every 0.2 s. Root only. It sets
# the script's EXIT trap; a script with one of its own calls dev_null_unguard
# from it.
guard_dev_null() {
	[ "$(id -u)" -eq 0 ] || return 0
	if command -v python3 >/dev/null 2>&1; then
		python3 "$(dirname "${BASH_SOURCE[0]}")/devnull-guard.py" &
	else
		(while sleep 0.2; do ensure_dev_null; done) &
	fi
	DEV_NULL_GUARD=$!
	trap dev_null_unguard EXIT
}

# dev_null_unguard stops guard_dev_null's guard and mends /dev/null once more.
dev_null_unguard() {
	[ -n "${DEV_NULL_GUARD:-}" ] && kill "$DEV_NULL_GUARD" 2>/dev/null
	ensure_dev_null
}

# free_gb PATH: the space free on PATH's file system (its nearest existing
# ancestor's), in GiB, rounded down.
free_gb() {
	local p=$1
	while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done
	df -P -k "$p" | awk 'NR == 2 { print int($4 / 1048576) }'
}

# least_free_gb PATH...: the least of free_gb over the PATHs.
least_free_gb() {
	local p n least=""
	for p in "$@"; do
		n=$(free_gb "$p")
		if [ -z "$least" ] || [ "$n" -lt "$least" ]; then least=$n; fi
	done
	echo "$least"
}

# remove_target_tmp_dirs FIND_TEST...: the tests' loopback targets are this
# machine's sshd, so Ansible makes their plays' remote tmp dirs in this
# user's home (one per target, empty after the play); removes the empty
# ones that also pass FIND_TEST (e.g. -mmin +360).
remove_target_tmp_dirs() {
	find "$HOME/.ansible/tmp" -mindepth 1 -maxdepth 1 -type d -name 'autoprov-*' -empty "$@" -delete 2>/dev/null || true
}

# TEST_TEMP_PATTERNS: the names that test processes give what they make in
# the temp dir (their binaries, run roots, targets; Go's t.TempDir and
# build dirs; the payload dirs of modules killed mid-task). A test process
# removes its own when it ends; one that was killed (a timeout, kill -9, a
# full disk) cannot.
TEST_TEMP_PATTERNS=(
	'infra-e2e-bin-*' 'deploy-test-bin-*' 'autoprov-test-bin-*' 'ansible-tests-runguard-*'
	'runguard-bin*' 'runguard-test*' 'aptgt*' 'aprun*' 'aptarget*' 'dptgt*' 'apc-*' 'e2r*'
	'ap-*' 'dj-*' 'Test*' 'go-build*' 'chromedp-runner*' 'org.chromium.Chromium.*' 'ansible_*_payload_*'
)

# sweep_test_leftovers MINUTES: removes what test runs left in the temp dir
# (TEST_TEMP_PATTERNS, this user's) untouched for more than MINUTES, and
# says how much that was. A test run under way keeps touching its own.
sweep_test_leftovers() {
	local tmp=${TMPDIR:-/tmp} args=() p list
	for p in "${TEST_TEMP_PATTERNS[@]}"; do args+=(-o -name "$p"); done
	remove_target_tmp_dirs -mmin "+$1"
	list=$(find "$tmp" -mindepth 1 -maxdepth 1 -user "$(id -u)" -mmin "+$1" \( "${args[@]:1}" \) 2>/dev/null) || true
	[ -n "$list" ] || return 0
	step "removing $(wc -l <<<"$list") leftovers of earlier test runs in $tmp ($(du -csh $list 2>/dev/null | tail -1 | cut -f1))"
	xargs -d '\n' rm -rf <<<"$list"
}

# ensure_disk_space GB: makes sure GB GiB are free for a test run's temp
# files and Go's build cache: below that, first what earlier test runs left
# behind goes (sweep_test_leftovers), then Go's build cache (rebuilt as
# needed); it dies, naming the file systems, when that is still not enough.
ensure_disk_space() {
	local need=$1 tmp=${TMPDIR:-/tmp} cache free
	cache=$(go env GOCACHE 2>/dev/null || echo "$tmp")
	free=$(least_free_gb "$tmp" "$cache")
	[ "$free" -ge "$need" ] && return 0
	step "only ${free} GiB free, a test run needs about ${need} GiB"
	sweep_test_leftovers 60
	if [ "$(least_free_gb "$tmp" "$cache")" -lt "$need" ]; then
		step "emptying Go's build cache $cache ($(du -sh "$cache" 2>/dev/null | cut -f1)): it is rebuilt as needed"
		go clean -cache
	fi
	free=$(least_free_gb "$tmp" "$cache")
	[ "$free" -ge "$need" ] || die "only ${free} GiB free for $tmp and $cache; a test run needs about ${need} GiB (TEST_MIN_FREE_GB): free some space first (df -h)"
	step "${free} GiB free now"
}

# report_test_leftovers BEFORE: lists what is in the temp dir now and was
# not in BEFORE (a file of names, ls -A), with its size: what a test run
# left behind. Returns 1 when there is any, 0 otherwise.
report_test_leftovers() {
	local tmp=${TMPDIR:-/tmp} new
	new=$(ls -A "$tmp" | LC_ALL=C sort | LC_ALL=C comm -13 <(LC_ALL=C sort "$1") -) || true
	[ -n "$new" ] || return 0
	printf '\033[1;33mleft in %s by this run:\033[0m\n' "$tmp" >&2
	(cd "$tmp" && xargs -d '\n' du -sh -- <<<"$new" 2>/dev/null | sort -h | tail -20) >&2
	return 1
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

# AXE_CORE_VERSION is the axe-core the console's browser tests check every
# page with (accessibility).
AXE_CORE_VERSION=4.14.1

# ensure_axe_core: install axe-core AXE_CORE_VERSION from npm under run/npm
# (once; npm from Debian when the machine has none) and export AXE_CORE_JS,
# the browser build the console's browser test injects into every page.
ensure_axe_core() {
	local root dir js
	root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
	dir="$root/run/npm/axe-core-$AXE_CORE_VERSION"
	js="$dir/node_modules/axe-core/axe.min.js"
	if [ ! -s "$js" ]; then
		if ! command -v npm >/dev/null 2>&1; then
			[ "$(id -u)" -eq 0 ] || die "npm is missing: install it as root (apt-get install -y npm); the console's browser tests need axe-core from npm"
			step "installing npm (Debian) for axe-core"
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
		fi
		step "installing axe-core $AXE_CORE_VERSION from npm (the console's accessibility checks)"
		mkdir -p "$dir"
		npm install --prefix "$dir" --no-audit --no-fund --silent "axe-core@$AXE_CORE_VERSION" >/dev/null ||
			die "npm install axe-core@$AXE_CORE_VERSION failed"
	fi
	export AXE_CORE_JS="$js"
}

# check_play_user_reads DIR: when plays run as the unprivileged user
# autoprov-play (root, the user exists: make run and the tests), check that
# it can reach and read DIR (the clone's ansible/) and die naming the
# directory in the way and what to do. A clone under a private home (/root
# is 0700) or mktemp -d otherwise fails every play with Ansible's "the
# playbook ... could not be found". infra makes the same check at start.
check_play_user_reads() {
	local dir=$1 user=autoprov-play d
	[ "$(id -u)" -eq 0 ] && id -u "$user" >/dev/null 2>&1 || return 0
	runuser -u "$user" -- test -r "$dir/playbooks/setup_server.yml" 2>/dev/null && return 0
	# From / down: the first directory the user cannot search.
	local ancestors=() path=$dir
	while [ "$path" != / ]; do
		path=$(dirname "$path")
		ancestors=("$path" "${ancestors[@]}")
	done
	for d in "${ancestors[@]}" "$dir"; do
		if ! runuser -u "$user" -- test -x "$d" 2>/dev/null; then
			die "the play user $user cannot read $dir: $d is $(stat -c '%A, owner %U' "$d"), so every play would fail (\"the playbook ... could not be found\").
  Clone the repository outside a private directory (e.g. under /srv or /opt), or open the way: chmod o+x $d"
		fi
	done
	die "the play user $user cannot read $dir/playbooks/setup_server.yml: make ansible/ readable by others (chmod -R o+rX $dir)"
}
