# syntax=docker/dockerfile:1
#
# Images of the three services, built from this repository (one build stage
# compiles every binary; each service has its own small runtime stage):
#
#   docker build --target scheduler -t autoprov/scheduler .
#   docker build --target infra     -t autoprov/infra .
#   docker build --target deployer  -t autoprov/deployer .
#
# Rules this file keeps (deploy/dockerfile_test.go checks them): every base
# image pinned to an exact version, multi-stage, every runtime stage runs as
# a non-root user, no secret in an ARG, ENV or layer (secrets reach the
# containers at run time, from the environment or Vault).
#
# The base images are build arguments whose defaults are the public, pinned
# images. scripts/containers.sh builds the same stages from local images
# instead, on hosts that reach no image registry: a debootstrap root
# imported into podman, and that root plus the host's Go toolchain; it
# passes GOPROXY=off and mounts the host's module cache (GOMODCACHE), so no
# stage downloads anything but Debian packages.
ARG GO_IMAGE=golang:1.26.8-bookworm
ARG DEBIAN_IMAGE=debian:12.12-slim
ARG RUNTIME_IMAGE=alpine:3.22.2

# ---- build: every Go binary, static -------------------------------------
FROM ${GO_IMAGE} AS build
ARG GOPROXY
ARG GOMODCACHE
# -tags grpcnotrace: as GOTAGS in the Makefile (why: there).
ARG GOFLAGS="-trimpath -tags=grpcnotrace"
WORKDIR /src
ENV CGO_ENABLED=0 GOTOOLCHAIN=local
COPY . .
RUN --mount=type=cache,target=/root/.cache/go-build \
    --mount=type=cache,target=/go/pkg/mod \
    go build -ldflags='-s -w' -o /out/ \
        ./services/scheduler ./services/infra ./services/deployer \
        ./pkg/ansible/cmd/runguard ./cmd/autoprov

# ---- a small base for the Go-only services ---------------------------------
# The user is written into /etc/passwd directly: the same on Alpine (the
# default) and on Debian (the local base of scripts/containers.sh).
FROM ${RUNTIME_IMAGE} AS gobase
RUN echo 'autoprov:x:10001:' >>/etc/group \
 && echo 'autoprov:x:10001:10001:autoprov:/nonexistent:/sbin/nologin' >>/etc/passwd
COPY --from=build /out/autoprov /usr/local/bin/autoprov
USER 10001:10001

# ---- scheduler -------------------------------------------------------------
FROM gobase AS scheduler
COPY --from=build /out/scheduler /usr/local/bin/scheduler
ENV ADMIN_ADDR=0.0.0.0:9101 ADMIN_ALLOW_REMOTE=true LOG_FORMAT=json
EXPOSE 9101
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["autoprov", "probe", "http://127.0.0.1:9101/readyz"]
ENTRYPOINT ["/usr/local/bin/scheduler"]

# ---- deployer --------------------------------------------------------------
FROM gobase AS deployer
COPY --from=build /out/deployer /usr/local/bin/deployer
ENV ADMIN_ADDR=0.0.0.0:9103 ADMIN_ALLOW_REMOTE=true LOG_FORMAT=json
EXPOSE 9103
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["autoprov", "probe", "http://127.0.0.1:9103/readyz"]
ENTRYPOINT ["/usr/local/bin/deployer"]

# ---- infra: Go binary + ansible-core, openssh-client and runguard ----------
# ansible-core (2.14, Debian 12) carries ansible.builtin, the only collection
# the roles use (deploy/dockerfile_test.go checks that against ansible/);
# git fetches Ansible jobs' repositories, bubblewrap is the runs' sandbox.
FROM ${DEBIAN_IMAGE} AS infra
RUN apt-get update \
 && apt-get install -y --no-install-recommends ansible-core openssh-client ca-certificates bubblewrap git \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 autoprov \
 && useradd --system --uid 10001 --gid autoprov --create-home --home-dir /home/autoprov --shell /usr/sbin/nologin autoprov \
 && install -d -o autoprov -g autoprov -m 0700 /var/lib/autoprov
COPY --from=build /out/infra /out/runguard /out/autoprov /usr/local/bin/
COPY ansible/ansible.cfg /opt/autoprov/ansible/ansible.cfg
COPY ansible/playbooks /opt/autoprov/ansible/playbooks
COPY ansible/roles /opt/autoprov/ansible/roles
COPY ansible/plugins /opt/autoprov/ansible/plugins
WORKDIR /home/autoprov
ENV ADMIN_ADDR=0.0.0.0:9102 ADMIN_ALLOW_REMOTE=true LOG_FORMAT=json \
    PLAYBOOK_DIR=/opt/autoprov/ansible \
    PLAYBOOK_BIN=/usr/bin/ansible-playbook \
    PLAYBOOK_RUN_ROOT=/var/lib/autoprov/runs \
    PLAYBOOK_FACT_CACHE=/var/lib/autoprov/facts \
    PLAYBOOK_GUARD=/usr/local/bin/runguard \
    PLAYBOOK_SANDBOX=bwrap
# Every run in a bubblewrap sandbox of its own (PLAYBOOK_SANDBOX=bwrap, the
# default, said here so the image states it). As uid 10001 with no
# capabilities, bubblewrap needs a user namespace and an unmasked /proc from
# the runtime: run the image with --security-opt systempaths=unconfined (and,
# on Docker, whose default seccomp profile refuses user namespaces,
# seccomp=unconfined); docker-compose.yml and deploy/k8s say how and why
# (docs/security.md, "The sandbox on each deployment form"). Infra refuses to
# start when the sandbox cannot be made.
USER 10001:10001
EXPOSE 9102
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["autoprov", "probe", "http://127.0.0.1:9102/readyz"]
ENTRYPOINT ["/usr/local/bin/infra"]

# ---- demo: the main job of `make run`, from the outside (compose only) -----
FROM ${DEBIAN_IMAGE} AS demo
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-msgpack python3-redis postgresql-client \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 autoprov \
 && useradd --system --uid 10001 --gid autoprov --no-create-home --shell /usr/sbin/nologin autoprov
COPY scripts/demo-job.py /usr/local/bin/demo-job.py
COPY deploy/docker/demo.sh /usr/local/bin/demo.sh
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/demo.sh"]

# ---- target: a Debian server for the demo job (sshd; compose only) ---------
# It plays a freshly installed server, so sshd runs as root here: it is no
# service of ours and is never deployed outside docker compose.
FROM ${DEBIAN_IMAGE} AS target
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssh-server python3 sudo iproute2 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /run/sshd /root/.ssh && chmod 0700 /root/.ssh
COPY deploy/docker/target.sh /usr/local/bin/target.sh
EXPOSE 22
HEALTHCHECK --interval=5s --timeout=3s --retries=10 CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/22"]
ENTRYPOINT ["/usr/local/bin/target.sh"]
