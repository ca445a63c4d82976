package jobs

import (
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern/patterntest"
)

// Each length-bounded pattern of the package is its bounded regular
// expression (package pattern says why they are written apart).
func TestPatternsAreTheirBoundedExpressions(t *testing.T) {
	patterntest.All(t, []patterntest.Case{
		{Name: "sshUserRE", M: sshUserRE, Original: `^[A-Za-z_][A-Za-z0-9_.-]{0,31}$`},
		{Name: "envNameRE", M: envNameRE, Original: `^[A-Z_][A-Z0-9_]{0,127}$`},
		{Name: "aliasRE", M: aliasRE, Original: `^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`},
	})
}
