package ansible

import (
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern/patterntest"
)

// Each length-bounded pattern of the package is its bounded regular
// expression (package pattern says why they are written apart).
func TestPatternsAreTheirBoundedExpressions(t *testing.T) {
	patterntest.All(t, []patterntest.Case{
		{Name: "factCacheNameRE", M: factCacheNameRE, Original: `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`},
		{Name: "jobAliasRe", M: jobAliasRe, Original: `^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}$`},
		{Name: "groupNameRe", M: groupNameRe, Original: `^[A-Za-z_][A-Za-z0-9_]{0,127}$`},
		{Name: "jobTagRe", M: jobTagRe, Original: `^[A-Za-z0-9_.:-]{1,128}$`},
		{Name: "aliasRe", M: aliasRe, Original: `^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`},
		{Name: "hostnameRe", M: hostnameRe, Original: `^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$`},
		{Name: "userRe", M: userRe, Original: `^[A-Za-z_][A-Za-z0-9_.-]{0,31}$`},
	})
}
