# Vault policy of the infra service's own token (VAULT_TOKEN, VAULT_TOKEN_FILE
# or the AppRole of VAULT_ROLE_ID): the fleet's SSH private keys, named by
# SSH_KEY_REF (vault:secret/infra/ssh#private_key in docs/configuration.md) and by the
# servers' ssh_key_ref. Nothing a request names is ever read with this token:
# requests use the token of infra-projects.hcl.
#
#   vault policy write autoprov-infra-ssh deploy/vault/infra-ssh.hcl
#   vault write auth/approle/role/autoprov-infra-ssh token_policies=autoprov-infra-ssh \
#       token_ttl=1h token_max_ttl=24h secret_id_ttl=0
#
# Set VAULT_ALLOWED_PATHS to the same paths so that infra refuses any other
# read before it reaches Vault.

path "secret/data/infra/ssh" {
  capabilities = ["read"]
}

path "secret/data/infra/ssh/*" {
  capabilities = ["read"]
}

# Token renewal (also in Vault's default policy).
path "auth/token/lookup-self" {
  capabilities = ["read"]
}

path "auth/token/renew-self" {
  capabilities = ["update"]
}
