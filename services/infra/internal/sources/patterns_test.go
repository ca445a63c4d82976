package sources

import (
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern/patterntest"
)

// Each length-bounded pattern of the package is its bounded regular
// expression (package pattern says why they are written apart).
func TestPatternsAreTheirBoundedExpressions(t *testing.T) {
	patterntest.All(t, []patterntest.Case{
		{"hexRe", hexRe, `^[0-9a-f]{7,64}$`},
		{"serverNameRe", serverNameRe, `^[a-z0-9_]{1,64}$`},
		{"roleNameRe", roleNameRe, `^[A-Za-z0-9_.-]{1,128}$`},
		{"versionRe", versionRe, `^[0-9A-Za-z.,<>=!*+ -]{0,128}$`},
	})
}
