package jobs

import (
	"context"

	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sources"
)

// CacheSources are JobSources served by a cache of bare clones (package
// sources).
type CacheSources struct{ Cache *sources.Cache }

// Checkout checks url at ref out into dst through the cache.
func (s CacheSources) Checkout(ctx context.Context, url, ref, token, dst string) (string, error) {
	return s.Cache.Checkout(ctx, sources.Repo{URL: url, Ref: ref, Token: token}, dst)
}

// SafePath is sources.SafePath.
func (CacheSources) SafePath(root, rel string) (string, error) { return sources.SafePath(root, rel) }
