package sources

import "errors"

// PlayOptions are the settings of a generated play.
type PlayOptions struct {
	// Hosts is the play's host pattern; empty means "all" (the job's
	// --limit narrows it).
	Hosts string
	// Become runs the role with become.
	Become bool
	// GatherFacts gathers facts first (Ansible's default is true; the
	// zero value here is false, so the caller says).
	GatherFacts bool
}

// RolePlay writes a play (0600, at path, which must not exist) that runs
// the role in directory roleDir (an absolute path, as SafePath returns)
// with vars as its role variables, every string tagged !unsafe so that
// Ansible never templates request data.
func RolePlay(path, roleDir string, vars map[string]any, opts PlayOptions) error {
	return errors.New("not implemented")
}

// CollectionRolePlay writes a play (0600, at path) that runs the role
// fqcn (namespace.collection.role) with vars, like RolePlay.
func CollectionRolePlay(path, fqcn string, vars map[string]any, opts PlayOptions) error {
	return errors.New("not implemented")
}
