package sources

import (
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern/patterntest"
)

// Each length-bounded pattern of the package is its bounded regular
// expression (package pattern says why they are written apart).
func TestPatternsAreTheirBoundedExpressions(t *testing.T) {
	patterntest.All(t, []patterntest.Case{
		{Name: "hexRe", M: hexRe, Original: `^[0-9a-f]{7,64}$`},
		{Name: "serverNameRe", M: serverNameRe, Original: `^[a-z0-9_]{1,64}$`},
		{Name: "roleNameRe", M: roleNameRe, Original: `^[A-Za-z0-9_.-]{1,128}$`},
		{Name: "versionRe", M: versionRe, Original: `^[0-9A-Za-z.,<>=!*+ -]{0,128}$`},
	})
}
