package deployments

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// ServerVar is the inline inventory variable that names a registered
// server by its handle: the host is that server, reached as registered.
// Infra reads the same name (its jobs package).
const ServerVar = "autoprov_server"

// UnknownServerError: a job names, by handle, a registered server its
// project cannot see: none has the handle, or another project owns it. The
// API answers 404 for both, naming the field, so that a caller learns
// nothing of other projects' servers.
type UnknownServerError struct {
	Field string
}

func (e *UnknownServerError) Error() string {
	return e.Field + ": no registered server of the project has this handle"
}

// notOwned is the message of a target that is another project's (or the
// fleet's) registered server. It names no owner.
const notOwned = "is a registered server this project does not own (an operator sets a server's projects)"

// owners returns the owners of the registered servers at address (a
// canonical address) with SSH port port (0: any port), one list per
// server; none when no server is registered there.
func (s *Service) owners(ctx context.Context, address string, port int) ([][]string, error) {
	rows, err := s.db.Query(ctx, `SELECT projects FROM servers
		WHERE address = $1 AND ($2 = 0 OR ssh_port = $2)`, address, port)
	if err != nil {
		return nil, fmt.Errorf("owners of the servers at %s: %w", address, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[[]string])
	if err != nil {
		return nil, fmt.Errorf("owners of the servers at %s: %w", address, err)
	}
	return out, nil
}

// reaches reports whether a request of project may target every server
// of lists: servers the project owns, and, for a fleet-wide key, the
// fleet's own (no project). Another project's server is never reached:
// infra refuses it whoever asked (the message carries the project only).
func reaches(lists [][]string, project string, fleetWide bool) bool {
	for _, l := range lists {
		if !slices.Contains(l, project) && !(fleetWide && len(l) == 0) {
			return false
		}
	}
	return true
}

// deployOwnership refuses a deployment of project to a registered server
// (infra finds it by address alone) that project does not own, unless v is
// fleet-wide and the server is the fleet's: the problem of server_ip, or
// nil.
func (s *Service) deployOwnership(ctx context.Context, v Visibility, project, serverIP string) (*FieldError, error) {
	if s.db == nil {
		return nil, nil
	}
	addr, err := store.CanonicalAddress(serverIP)
	if err != nil {
		return nil, nil // the wire's rules said so already
	}
	lists, err := s.owners(ctx, addr, 0)
	if err != nil {
		return nil, err
	}
	if !reaches(lists, project, v.All) {
		return &FieldError{Field: "server_ip", Message: notOwned}, nil
	}
	return nil, nil
}

// jobOwnership refuses a job of project whose inline hosts target a
// registered server that project does not own (for a fleet-wide v: that
// another project owns): by
// handle (autoprov_server: *UnknownServerError, a 404), by address
// literal and SSH port (the problems of the hosts' fields). A host named
// by a DNS name is infra's to check, after it resolved it.
func (s *Service) jobOwnership(ctx context.Context, r *JobRequest, v Visibility, project string) ([]FieldError, error) {
	if s.db == nil {
		return nil, nil
	}
	var out []FieldError
	for _, name := range r.HostNames() {
		vars := r.Inventory.Hosts[name]
		field := "inventory.hosts[" + name + "]"
		if h, ok := vars[ServerVar].(string); ok {
			srv, err := store.GetServer(ctx, s.db, h)
			switch {
			case errors.Is(err, store.ErrServerNotFound):
				return nil, &UnknownServerError{Field: field + "[" + ServerVar + "]"}
			case err != nil:
				return nil, err
			case !reaches([][]string{srv.Projects}, project, v.All) && !v.All:
				return nil, &UnknownServerError{Field: field + "[" + ServerVar + "]"}
			case !reaches([][]string{srv.Projects}, project, v.All):
				out = append(out, FieldError{Field: field + "[" + ServerVar + "]", Message: notOwned})
			}
			continue
		}
		addr := name
		if a, ok := vars["ansible_host"].(string); ok {
			field, addr = field+"[ansible_host]", a
		}
		canonical, err := store.CanonicalAddress(addr)
		if err != nil {
			continue // a name: infra resolves it, then checks
		}
		port := 0
		if p, ok := vars["ansible_port"].(float64); ok && p == math.Trunc(p) && p >= 1 && p <= 65535 {
			port = int(p)
		}
		lists, err := s.owners(ctx, canonical, port)
		if err != nil {
			return nil, err
		}
		if !reaches(lists, project, v.All) {
			out = append(out, FieldError{Field: field, Message: notOwned})
		}
	}
	return out, nil
}
