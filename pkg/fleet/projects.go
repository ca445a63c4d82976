package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// EventProjects: the server's owning projects changed (an operator's
// SetProjects; a source's own changes are part of its sync).
const EventProjects = "projects"

// MaxProjects is how many projects may own one server.
const MaxProjects = 64

// CanonicalProjects checks project ids by the rule of a request's
// project_id and returns them lower-cased, sorted, without duplicates;
// nil stays nil (the source says nothing), an empty list stays empty.
func CanonicalProjects(list []string) ([]string, error) {
	if list == nil {
		return nil, nil
	}
	out := make([]string, 0, len(list))
	for _, p := range list {
		id, ok := messages.CanonicalProjectID(strings.TrimSpace(p))
		if !ok {
			return nil, fmt.Errorf("project %q is not a project id (a UUID, 8-4-4-4-12 hex digits)", p)
		}
		out = append(out, id)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > MaxProjects {
		return nil, fmt.Errorf("%d projects: at most %d may own a server", len(out), MaxProjects)
	}
	return out, nil
}

// ParseProjects reads a list of project ids written as text (an inventory
// variable, a provider tag, a command-line flag): separated by commas or
// white space. "" is the empty list.
func ParseProjects(s string) ([]string, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' })
	return CanonicalProjects(append([]string{}, fields...))
}

// SetProjects sets the projects that own the server (an operator's
// decision; empty makes it fleet-only), with a history row. A server whose
// source sets its owners (ProjectsFromSource) is refused with
// ErrNotAllowed: the source would undo the change, so change the source.
// Setting the owners it has changes nothing.
func (s *Store) SetProjects(ctx context.Context, handle string, projects []string, actor, reason string) (*Server, error) {
	if err := checkActor(actor); err != nil {
		return nil, err
	}
	if projects == nil {
		projects = []string{}
	}
	list, err := CanonicalProjects(projects)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return s.change(ctx, handle, func(_ pgx.Tx, srv *Server) ([]History, error) {
		if srv.ProjectsFromSource {
			return nil, fmt.Errorf("set the projects of server %s: its source (%s) sets them: %w",
				handle, srv.Source, ErrNotAllowed)
		}
		if slices.Equal(srv.Projects, list) {
			return nil, nil
		}
		r := "projects: " + describeProjects(list) + " (were " + describeProjects(srv.Projects) + ")"
		if reason != "" {
			r += ": " + reason
		}
		srv.Projects = list
		return []History{{Event: EventProjects, From: srv.Status, To: srv.Status, Reason: r, Actor: actor}}, nil
	})
}

// describeProjects names a list of owners for people.
func describeProjects(list []string) string {
	if len(list) == 0 {
		return "none (fleet-only)"
	}
	return strings.Join(list, ", ")
}
