#!/bin/sh
# target.sh: the demo target of docker compose (a fresh Debian server).
#   target.sh keys   make the demo key pair in /keys once (vault-init loads
#                    the private key into Vault; infra reads it from there)
#   target.sh        trust /keys/id_ed25519.pub for root and run sshd
set -eu
if [ "${1:-}" = keys ]; then
	if [ ! -s /keys/id_ed25519 ]; then
		ssh-keygen -q -t ed25519 -N '' -C autoprov-demo -f /keys/id_ed25519
	fi
	# vault-init reads the key as another user; the volume holds nothing else.
	chmod 0644 /keys/id_ed25519 /keys/id_ed25519.pub
	echo "demo key pair ready"
	exit 0
fi
install -m 0600 /keys/id_ed25519.pub /root/.ssh/authorized_keys
ssh-keygen -A
exec /usr/sbin/sshd -D -e
