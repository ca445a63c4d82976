// Package sourcestest serves real git repositories and a Galaxy stand-in
// on loopback for tests of sources, inventories and jobs.
package sourcestest

import (
	"sync/atomic"
	"testing"
)

// GitServer is git's smart HTTP server (git http-backend behind
// net/http/cgi) on 127.0.0.1 that answers only requests carrying its
// token as HTTP basic authentication (x-access-token:<token>).
type GitServer struct {
	URL        string // http://127.0.0.1:port
	Root       string // directory of the bare repositories
	Token      string
	Authorized atomic.Int32 // requests served
	Refused    atomic.Int32 // requests without the token
}

// NewGitServer starts a server for the test; token empty means no
// authentication.
func NewGitServer(t testing.TB, token string) *GitServer { panic("not implemented") }

// WorkRepo is a working repository that pushes to a bare one on a
// GitServer.
type WorkRepo struct {
	URL string // the repository's URL on the server
	Dir string // the working tree
}

// NewRepo creates the bare repository path (e.g. "acme/site.git") and a
// working repository for it, on branch main.
func (g *GitServer) NewRepo(t testing.TB, path string) *WorkRepo { panic("not implemented") }

// Commit writes files (path -> content; parents created), removes remove,
// commits everything and pushes main; it returns the commit id.
func (r *WorkRepo) Commit(t testing.TB, files map[string]string, remove ...string) string {
	panic("not implemented")
}

// Tag tags the current commit as name and pushes the tag.
func (r *WorkRepo) Tag(t testing.TB, name string) { panic("not implemented") }

// Git runs git in the working repository and returns its trimmed output.
func (r *WorkRepo) Git(t testing.TB, args ...string) string { panic("not implemented") }
