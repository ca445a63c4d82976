package messages

import (
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern/patterntest"
)

// Each length-bounded pattern of the package is its bounded regular
// expression (package pattern says why they are written apart).
func TestPatternsAreTheirBoundedExpressions(t *testing.T) {
	patterntest.All(t, []patterntest.Case{
		{Name: "poolRE", M: poolRE, Original: PoolPattern},
		{Name: "varNameRE", M: varNameRE, Original: `^[A-Za-z_][A-Za-z0-9_]{0,127}$`},
		{Name: "hostNameRE", M: hostNameRE, Original: `^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}$`},
		{Name: "groupNameRE", M: groupNameRE, Original: `^[A-Za-z_][A-Za-z0-9_]{0,127}$`},
		{Name: "collectionRE", M: collectionRE, Original: `^[a-z0-9][a-z0-9_]{0,63}\.[a-z0-9][a-z0-9_]{0,63}$`},
		{Name: "roleNameRE", M: roleNameRE, Original: `^[a-z0-9][a-z0-9_]{0,63}$`},
		{Name: "pluginRE", M: pluginRE, Original: `^[a-z0-9][a-z0-9_]{0,63}\.[a-z0-9][a-z0-9_]{0,63}\.[a-z0-9][a-z0-9_]{0,63}$`},
		{Name: "versionRE", M: versionRE, Original: `^[A-Za-z0-9.,<>=!*+ -]{1,128}$`},
		{Name: "tagRE", M: tagRE, Original: `^[A-Za-z0-9_.:-]{1,128}$`},
		{Name: "serverHandleRE", M: serverHandleRE, Original: ServerHandlePattern},
		{Name: "ownerRE", M: ownerRE, Original: `^[A-Za-z0-9][A-Za-z0-9-]{0,38}$`},
		{Name: "repoRE", M: repoRE, Original: `^[A-Za-z0-9._-]{1,100}$`},
		{Name: "errorKindRE", M: errorKindRE, Original: `^[a-z][a-z0-9_]{0,63}$`},
		{Name: "entryIDRE", M: entryIDRE, Original: `^[0-9]{1,20}-[0-9]{1,20}$`},
		{Name: "keyIDRE", M: keyIDRE, Original: KeyIDPattern},
		{Name: "signatureRE", M: signatureRE, Original: SignaturePattern},
		{Name: "idRE", M: idRE, Original: `^[!-~]{1,255}$`},
	})
}
