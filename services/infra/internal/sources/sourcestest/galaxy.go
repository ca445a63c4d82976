package sourcestest

import "testing"

// GalaxyServer is a stand-in of the Galaxy v3 API on 127.0.0.1, the part
// `ansible-galaxy collection install` uses: /api/ (available versions),
// /api/v3/collections/<ns>/<name>/, .../versions/, .../versions/<v>/ and
// the artifact download. It serves the tarballs the test adds, and
// requires its token (Authorization: Token <token>) when one is set.
type GalaxyServer struct {
	URL   string // http://127.0.0.1:port/api/ (the server URL for ansible-galaxy)
	Token string
}

// NewGalaxyServer starts a stand-in for the test.
func NewGalaxyServer(t testing.TB, token string) *GalaxyServer { panic("not implemented") }

// Add serves the collection tarball (as BuildCollection writes).
func (g *GalaxyServer) Add(t testing.TB, tarball string) { panic("not implemented") }

// Downloads counts the artifact downloads served.
func (g *GalaxyServer) Downloads() int { panic("not implemented") }

// BuildCollection writes a collection namespace.name at version with
// files (path in the collection -> content, e.g.
// "roles/hello/tasks/main.yml") and builds its tarball with
// `ansible-galaxy collection build`; it returns the tarball's path.
func BuildCollection(t testing.TB, namespace, name, version string, files map[string]string) string {
	panic("not implemented")
}
