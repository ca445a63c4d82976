package messages

import (
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern/patterntest"
)

// Each length-bounded pattern of the package is its bounded regular
// expression (package pattern says why they are written apart).
func TestPatternsAreTheirBoundedExpressions(t *testing.T) {
	patterntest.All(t, []patterntest.Case{
		{"poolRE", poolRE, PoolPattern},
		{"varNameRE", varNameRE, `^[A-Za-z_][A-Za-z0-9_]{0,127}$`},
		{"hostNameRE", hostNameRE, `^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}$`},
		{"groupNameRE", groupNameRE, `^[A-Za-z_][A-Za-z0-9_]{0,127}$`},
		{"collectionRE", collectionRE, `^[a-z0-9][a-z0-9_]{0,63}\.[a-z0-9][a-z0-9_]{0,63}$`},
		{"roleNameRE", roleNameRE, `^[a-z0-9][a-z0-9_]{0,63}$`},
		{"pluginRE", pluginRE, `^[a-z0-9][a-z0-9_]{0,63}\.[a-z0-9][a-z0-9_]{0,63}\.[a-z0-9][a-z0-9_]{0,63}$`},
		{"versionRE", versionRE, `^[A-Za-z0-9.,<>=!*+ -]{1,128}$`},
		{"tagRE", tagRE, `^[A-Za-z0-9_.:-]{1,128}$`},
		{"serverHandleRE", serverHandleRE, ServerHandlePattern},
		{"ownerRE", ownerRE, `^[A-Za-z0-9][A-Za-z0-9-]{0,38}$`},
		{"repoRE", repoRE, `^[A-Za-z0-9._-]{1,100}$`},
		{"errorKindRE", errorKindRE, `^[a-z][a-z0-9_]{0,63}$`},
		{"entryIDRE", entryIDRE, `^[0-9]{1,20}-[0-9]{1,20}$`},
		{"keyIDRE", keyIDRE, KeyIDPattern},
		{"signatureRE", signatureRE, SignaturePattern},
		{"idRE", idRE, `^[!-~]{1,255}$`},
	})
}
