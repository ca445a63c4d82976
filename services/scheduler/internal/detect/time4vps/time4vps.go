// Package time4vps detects the servers of a Time4VPS account through
// pkg/time4vps: the server list, then each new server's details (once per
// process; the list carries what changes).
//
// A server's handle is "time4vps-<server id>" (stable, unlike its
// hostname); its address the main IP; labels: time4vps:domain,
// time4vps:label, time4vps:type and, from the details, time4vps:os.
package time4vps

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	t4v "github.com/autoprovisioner/autoprovisioner/pkg/time4vps"
)

// Source is the source name of Time4VPS servers; infra recognises it to
// refresh addresses and reinstall through the API.
const Source = "time4vps"

// API is what the detector needs of the Time4VPS client.
type API interface {
	ListServers(ctx context.Context) ([]t4v.ServerSummary, error)
	Server(ctx context.Context, serverID int64) (*t4v.Server, error)
}

// Detector lists a Time4VPS account's servers.
type Detector struct {
	api  API
	user string

	mu  sync.Mutex
	oss map[int64]string // details already read: server id -> os
}

// New returns a Detector; sshUser is the user new servers are reached as
// (Time4VPS installs with root).
func New(api API, sshUser string) *Detector {
	if sshUser == "" {
		sshUser = "root"
	}
	return &Detector{api: api, user: sshUser, oss: map[int64]string{}}
}

// Name is "time4vps".
func (d *Detector) Name() string { return Source }

// Detect lists the servers. A failure of the list is an error; a failure of
// one server's details only leaves its os label out until next time.
func (d *Detector) Detect(ctx context.Context, yield func(fleet.Detected) error) error {
	list, err := d.api.ListServers(ctx)
	if err != nil {
		return fmt.Errorf("time4vps: list servers: %w", err)
	}
	for _, s := range list {
		id := int64(s.ID)
		if id <= 0 || s.IP == "" {
			continue // not provisioned yet: no address to reach
		}
		labels := map[string]string{"time4vps:type": s.Type}
		if s.Domain != "" {
			labels["time4vps:domain"] = s.Domain
		}
		if s.Label != "" {
			labels["time4vps:label"] = s.Label
		}
		if os := d.os(ctx, id); os != "" {
			labels["time4vps:os"] = os
		}
		if err := yield(fleet.Detected{
			Handle: "time4vps-" + strconv.FormatInt(id, 10), Address: s.IP, SSHUser: d.user,
			ProviderID: strconv.FormatInt(id, 10), Labels: labels,
		}); err != nil {
			return err
		}
	}
	return nil
}

func (d *Detector) os(ctx context.Context, id int64) string {
	d.mu.Lock()
	os, ok := d.oss[id]
	d.mu.Unlock()
	if ok {
		return os
	}
	srv, err := d.api.Server(ctx, id)
	if err != nil {
		return ""
	}
	d.mu.Lock()
	d.oss[id] = srv.OS
	d.mu.Unlock()
	return srv.OS
}
