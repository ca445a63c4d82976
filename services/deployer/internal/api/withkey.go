package api

import (
	"context"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

type withKeyCtx struct{}

// WithKey returns ctx carrying key, a key its caller already checked (the
// web console, from its session): a request with this context and any
// Bearer value is served as key, with the key's scopes, projects and rate
// limit, as if it had sent the key itself. Only code in this process can
// set it; no request can.
func WithKey(ctx context.Context, key *auth.Key) context.Context {
	return context.WithValue(ctx, withKeyCtx{}, key)
}

// contextKeys authenticates a request that carries a key from WithKey as
// that key, and any other through the key store.
type contextKeys struct{ next Authenticator }

func (c contextKeys) Authenticate(ctx context.Context, secret string) (*auth.Key, error) {
	if key, _ := ctx.Value(withKeyCtx{}).(*auth.Key); key != nil {
		return key, nil
	}
	return c.next.Authenticate(ctx, secret)
}

// VisibilityOf is what key may see and act on, as every deployments
// handler decides it (the web console's own reads use it too).
func VisibilityOf(key *auth.Key) deployments.Visibility { return visibility(key) }
