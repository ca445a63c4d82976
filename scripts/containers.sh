#!/usr/bin/env bash
# containers.sh: build the images of docker-compose.yml with podman on a
# machine that reaches no image registry, and run the compose stack.
#
#   scripts/containers.sh deps     install podman, runc, podman-compose and
#                                  CNI's dnsname plugin from Debian (as root)
#   scripts/containers.sh images   build every image from local bases (below)
#   scripts/containers.sh test     images, then the container test
#                                  (deploy/containers_test.go: the compose
#                                  stack runs the main job; make test's lane)
#   scripts/containers.sh run      the same, for a user (make run-compose):
#                                  the stack's output live
#
# The local bases: the Debian root file system `make run` builds for its
# targets (bin/testtarget image: debootstrap, cached in .cache/testtarget)
# imported as localhost/autoprov-local/debian:bookworm, and that image plus
# this machine's Go toolchain (/usr/local/go, or `go env GOROOT`) as
# localhost/autoprov-local/go. The Dockerfile's stages are built from them
# (--build-arg GO_IMAGE, DEBIAN_IMAGE, RUNTIME_IMAGE); the go build runs
# with GOPROXY=off and the host's module cache mounted read-only, so nothing
# is downloaded but Debian packages from the root's mirror. Redis and
# Postgres are built from the same base (deploy/podman/*.Containerfile).
#
# Podman runs as root with runc and deploy/podman/containers.conf
# (CONTAINERS_CONF): no default ulimits, which this machine cannot raise.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/scripts/lib.sh"
cd "$ROOT"

export CONTAINERS_CONF="$ROOT/deploy/podman/containers.conf"
LOCAL=localhost/autoprov-local
BASE_IMAGE=$LOCAL/debian:bookworm
GO_VERSION=$(go env GOVERSION)
GO_IMAGE=$LOCAL/go:${GO_VERSION#go}

# elapsed START: seconds since START (date +%s).
elapsed() { echo "$(($(date +%s) - $1))s"; }

deps() {
	local missing=() p
	for p in podman runc podman-compose golang-github-containernetworking-plugin-dnsname debootstrap; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	[ "$(id -u)" -eq 0 ] || die "podman runs containers here as root: run as root, or install ${missing[*]}"
	step "installing ${missing[*]} (Debian packages)"
	DEBIAN_FRONTEND=noninteractive apt-get install -o DPkg::Lock::Timeout=600 -y --no-install-recommends "${missing[@]}" >/dev/null ||
		die "apt-get install ${missing[*]} failed"
}

# image_label IMAGE KEY: the value of label KEY of IMAGE, empty when it is missing.
image_label() {
	podman image inspect --format "{{ index .Labels \"$2\" }}" "$1" 2>/dev/null || true
}

# build_base: import the debootstrap root as the local Debian base, once per root.
build_base() {
	local t rootfs
	t=$(date +%s)
	(cd ansible/tests && go build -trimpath -o ../../bin/testtarget ./cmd/testtarget) || die "go build bin/testtarget failed"
	rootfs=$(bin/testtarget image) || die "no Debian root file system (bin/testtarget image)"
	if [ "$(image_label "$BASE_IMAGE" org.autoprov.rootfs)" = "$rootfs" ]; then
		step "base $BASE_IMAGE is up to date ($rootfs)"
		return 0
	fi
	step "importing $rootfs as $BASE_IMAGE"
	tar -C "$rootfs" -c . | podman import --change "LABEL org.autoprov.rootfs=$rootfs" \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null 2>&1
	podman rmi "$GO_IMAGE" >/dev/null 2>&1 || true # built on the old base
	step "base image in $(elapsed "$t")"
}

# build_go: the base plus this machine's Go toolchain.
build_go() {
	local t goroot cid
	t=$(date +%s)
	goroot=$(go env GOROOT)
	if podman image exists "$GO_IMAGE"; then
		step "Go build image $GO_IMAGE exists"
		return 0
	fi
	step "building $GO_IMAGE: $BASE_IMAGE plus $goroot"
	cid=$(podman create "$BASE_IMAGE" true)
	podman cp "$goroot" "$cid:/usr/local/go" || { podman rm "$cid" >/dev/null; die "podman cp $goroot failed"; }
	podman commit -q --change 'ENV PATH=/usr/local/go/bin:/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'ENV GOPATH=/go' --change 'ENV GOTOOLCHAIN=local' "$cid" "$GO_IMAGE" >/dev/null
	podman rm "$cid" >/dev/null
	step "Go build image in $(elapsed "$t")"
}

# build NAME ARGS...: podman build with the local bases, timed.
build() {
	local name=$1 t
	shift
	t=$(date +%s)
	podman build -q --layers --format docker --build-arg DEBIAN_IMAGE="$BASE_IMAGE" "$@" . >/dev/null ||
		{ ensure_dev_null; die "podman build $name failed (run it again without -q: podman build $* .)"; }
	ensure_dev_null # lib.sh
	step "image $name in $(elapsed "$t")"
}

images() {
	local t modcache target
	t=$(date +%s)
	deps
	build_base
	build_go
	modcache=$(go env GOMODCACHE)
	# Every module of the workspace must be in the host's cache: the build
	# stage runs with GOPROXY=off.
	go mod download || die "go mod download failed: the build stage needs every module of go.work in $modcache"
	for target in scheduler infra deployer demo target; do
		build "autoprov/$target" --target "$target" -t "localhost/autoprov/$target:dev" \
			--build-arg GO_IMAGE="$GO_IMAGE" --build-arg RUNTIME_IMAGE="$BASE_IMAGE" \
			--build-arg GOPROXY=off --build-arg GOMODCACHE=/gomodcache --build-arg GOFLAGS="-trimpath -buildvcs=false -tags=grpcnotrace" \
			--volume "$modcache:/gomodcache:ro"
	done
	podman tag localhost/autoprov/target:dev localhost/autoprov/demo-target:dev
	build redis -f deploy/podman/redis.Containerfile -t "$LOCAL/redis:dev"
	build postgres -f deploy/podman/postgres.Containerfile -t "$LOCAL/postgres:dev"
	# Earlier builds' images, now untagged (the layers the current images
	# and the build cache use stay).
	podman image prune -f >/dev/null || true
	step "every image built in $(elapsed "$t")"
}

case "${1:-}" in
deps) deps ;;
images)
	guard_dev_null
	images
	;;
test)
	guard_dev_null
	images
	step "container test: go test -tags containers -run TestContainers ./deploy"
	cd deploy && go test -tags containers -count=1 -timeout 15m -run TestContainers -v .
	;;
run)
	guard_dev_null
	images
	step "the compose stack: the main job, then infra scaled to 3 (deploy/containers_test.go)"
	cd deploy && go test -tags containers -count=1 -timeout 20m -run TestContainers -v .
	;;
*)
	echo "usage: $0 deps|images|test|run" >&2
	exit 2
	;;
esac
