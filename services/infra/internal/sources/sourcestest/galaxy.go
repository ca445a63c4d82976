package sourcestest

import (
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// The Galaxy stand-in is testenv's, which the deployer's tests use too
// (they cannot import this package).
type GalaxyServer = testenv.GalaxyServer

// NewGalaxyServer is testenv.NewGalaxyServer.
func NewGalaxyServer(t testing.TB, token string) *GalaxyServer {
	return testenv.NewGalaxyServer(t, token)
}

// BuildCollection is testenv.BuildCollection.
func BuildCollection(t testing.TB, namespace, name, version string, files map[string]string) string {
	return testenv.BuildCollection(t, namespace, name, version, files)
}
