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
# Each image is tagged with a digest of its inputs (src-<digest>: the base,
# the Go version and the files it is built from, tests left out) and built
# only when no image of that digest exists: an unchanged tree rebuilds
# nothing, and any change of an input rebuilds.
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
	local t rootfs key
	t=$(date +%s)
	(cd ansible/tests && go build -trimpath -o ../../bin/testtarget ./cmd/testtarget) || die "go build bin/testtarget failed"
	rootfs=$(bin/testtarget image) || die "no Debian root file system (bin/testtarget image)"
	# The root's folder is named by the key of its configuration
	# (debian-<suite>-<key>): the same name in another clone is the same
	# base, which keeps the images' digests (and so the images) valid.
	key=$(basename "$(dirname "$rootfs")")
	if [ "$(image_label "$BASE_IMAGE" org.autoprov.rootfs)" = "$key" ]; then
		step "base $BASE_IMAGE is up to date ($key)"
		return 0
	fi
	step "importing $rootfs as $BASE_IMAGE"
	tar -C "$rootfs" -c . | podman import --change "LABEL org.autoprov.rootfs=$key" \
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

# inputs_hash PATH...: a digest of the named files and of every file under
# the named folders (tracked or new, not ignored), test code and the Ansible
# content's tests left out: what an image is built from.
inputs_hash() {
	git ls-files -z -co --exclude-standard -- "$@" |
		grep -zv -e '_test\.go$' -e '^ansible/tests/' -e '/testdata/' |
		sort -z | xargs -0 -r sha256sum | sha256sum | cut -c1-16
}

# build NAME TAGS INPUTS ARGS...: podman build of image NAME tagged TAGS
# (space-separated), unless an image built from the same inputs exists: its
# tag is the digest of INPUTS (inputs_hash's, plus the base's id), so an
# unchanged image costs nothing and a changed input always rebuilds.
build() {
	local name=$1 tags=$2 inputs=$3 t tag first
	shift 3
	t=$(date +%s)
	first=${tags%% *}
	tag="${first%:*}:src-$inputs"
	if ! podman image exists "$tag"; then
		podman build -q --layers --format docker --build-arg DEBIAN_IMAGE="$BASE_IMAGE" -t "$tag" "$@" . >/dev/null ||
			{ ensure_dev_null; die "podman build $name failed (run it again without -q: podman build $* .)"; }
		ensure_dev_null # lib.sh
		step "image $name built in $(elapsed "$t") (inputs ${inputs})"
	else
		step "image $name is up to date (inputs ${inputs})"
	fi
	local each
	for each in $tags; do podman tag "$tag" "$each"; done
	# Older builds of the same image: their src tags go, the layers with them.
	podman images --format '{{.Repository}}:{{.Tag}}' "${first%:*}" | grep ':src-' | grep -vxF "$tag" |
		xargs -r podman rmi >/dev/null 2>&1 || true
}

images() {
	local t modcache target base src tags downloaded=""
	t=$(date +%s)
	deps
	build_base
	build_go
	modcache=$(go env GOMODCACHE)
	base=$(podman image inspect --format '{{.Id}}' "$BASE_IMAGE" | cut -c1-16)
	# The Dockerfile's images are built from the whole repository (COPY .),
	# of which these inputs reach them; the Go toolchain is the Go image's.
	src=$(printf '%s\n' "$base" "$GO_VERSION" \
		"$(inputs_hash Dockerfile .dockerignore go.work go.work.sum pkg services cmd ansible scripts/demo-job.py deploy/docker)" |
		sha256sum | cut -c1-16)
	for target in scheduler infra deployer demo target; do
		if [ "$target" != target ] && [ -z "$downloaded" ] && ! podman image exists "localhost/autoprov/$target:src-$src"; then
			# Every module of the workspace must be in the host's cache: the
			# build stage runs with GOPROXY=off.
			go mod download || die "go mod download failed: the build stage needs every module of go.work in $modcache"
			downloaded=1
		fi
		tags="localhost/autoprov/$target:dev"
		[ "$target" != target ] || tags+=" localhost/autoprov/demo-target:dev"
		build "autoprov/$target" "$tags" "$src" --target "$target" \
			--build-arg GO_IMAGE="$GO_IMAGE" --build-arg RUNTIME_IMAGE="$BASE_IMAGE" \
			--build-arg GOPROXY=off --build-arg GOMODCACHE=/gomodcache --build-arg GOFLAGS="-trimpath -buildvcs=false -tags=grpcnotrace" \
			--volume "$modcache:/gomodcache:ro"
	done
	for target in redis postgres; do
		build "$target" "$LOCAL/$target:dev" \
			"$(printf '%s\n' "$base" "$(inputs_hash "deploy/podman/$target.Containerfile" "deploy/podman/$target-entry.sh")" | sha256sum | cut -c1-16)" \
			-f "deploy/podman/$target.Containerfile"
	done
	# Earlier builds' images, now untagged (the layers the current images
	# and the build cache use stay).
	podman image prune -f >/dev/null || true
	step "every image ready in $(elapsed "$t")"
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
	cd deploy && go test -tags containers -count=1 -timeout 30m -run TestContainers -v .
	;;
run)
	guard_dev_null
	images
	step "the compose stack: the main job, then infra scaled to 3 (deploy/containers_test.go)"
	cd deploy && go test -tags containers -count=1 -timeout 30m -run TestContainers -v .
	;;
*)
	echo "usage: $0 deps|images|test|run" >&2
	exit 2
	;;
esac
