package inventory

import (
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern/patterntest"
)

// Each length-bounded pattern of the package is its bounded regular
// expression (package pattern says why they are written apart).
func TestPatternsAreTheirBoundedExpressions(t *testing.T) {
	patterntest.All(t, []patterntest.Case{
		{Name: "groupRe", M: groupRe, Original: `^[A-Za-z_][A-Za-z0-9_]{0,127}$`},
		{Name: "envRe", M: envRe, Original: `^[A-Z_][A-Z0-9_]{0,127}$`},
	})
}
