# Vault policy of the token infra resolves the secret references of requests
# with (PROJECT_VAULT_TOKEN, PROJECT_VAULT_TOKEN_FILE or the AppRole of
# PROJECT_VAULT_ROLE_ID): a deploy's github_token_ref and secrets_ref. It
# covers project secrets only, never the SSH keys of infra-ssh.hcl, Vault's
# own paths or other mounts. Which project may use which path is decided by
# infra before Vault is asked (DEPLOY_SECRET_REFS, docs/secrets.md); this
# policy is the limit behind that check.
#
#   vault policy write autoprov-infra-projects deploy/vault/infra-projects.hcl
#   vault write auth/approle/role/autoprov-infra-projects token_policies=autoprov-infra-projects \
#       token_ttl=1h token_max_ttl=24h secret_id_ttl=0
#
# PROJECT_VAULT_ALLOWED_PATHS defaults to these paths: infra refuses any
# other read before a request leaves.

path "secret/data/projects/*" {
  capabilities = ["read"]
}

# Token renewal (also in Vault's default policy).
path "auth/token/lookup-self" {
  capabilities = ["read"]
}

path "auth/token/renew-self" {
  capabilities = ["update"]
}
