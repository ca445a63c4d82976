package ansible

import (
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern/patterntest"
)

// Each length-bounded pattern of the package is its bounded regular
// expression (package pattern says why they are written apart).
func TestPatternsAreTheirBoundedExpressions(t *testing.T) {
	patterntest.All(t, []patterntest.Case{
		{"factCacheNameRE", factCacheNameRE, `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`},
		{"jobAliasRe", jobAliasRe, `^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}$`},
		{"groupNameRe", groupNameRe, `^[A-Za-z_][A-Za-z0-9_]{0,127}$`},
		{"jobTagRe", jobTagRe, `^[A-Za-z0-9_.:-]{1,128}$`},
		{"aliasRe", aliasRe, `^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`},
		{"hostnameRe", hostnameRe, `^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$`},
		{"userRe", userRe, `^[A-Za-z_][A-Za-z0-9_.-]{0,31}$`},
	})
}
