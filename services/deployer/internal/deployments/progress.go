package deployments

import (
	"context"
	"fmt"
	"strings"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// Progress summarises a running (or finished) job from its progress events.
type Progress struct {
	CurrentPlay string `json:"current_play,omitempty"`
	CurrentTask string `json:"current_task,omitempty"`
	// Hosts counts hosts by their state so far: failed, unreachable,
	// changed (something changed and nothing failed) or ok.
	HostsOK          int `json:"hosts_ok"`
	HostsChanged     int `json:"hosts_changed"`
	HostsFailed      int `json:"hosts_failed"`
	HostsUnreachable int `json:"hosts_unreachable"`
	// Tasks counts task results per host.
	Tasks map[string]*TaskCounts `json:"tasks,omitempty"`
	// Events is how many progress events were read; LastEvent is the time
	// of the newest.
	Events    int    `json:"events"`
	LastEvent string `json:"last_event_at,omitempty"`
	// Attempt is the attempt the events belong to (a job taken over by
	// another instance starts again).
	Attempt int `json:"attempt,omitempty"`
}

// TaskCounts counts the task results of one host.
type TaskCounts struct {
	OK          int `json:"ok"`
	Changed     int `json:"changed"`
	Failed      int `json:"failed"`
	Unreachable int `json:"unreachable"`
	Skipped     int `json:"skipped"`
}

// maxProgressEvents bounds the events read for a summary.
const maxProgressEvents = 20_000

// readProgress summarises the job's event stream; nil when it has none.
func readProgress(ctx context.Context, jobs *stream.Jobs, kind messages.JobKind, jobID string) (*Progress, error) {
	entries, err := jobs.Events(ctx, kind, jobID, "", maxProgressEvents)
	if err != nil {
		return nil, fmt.Errorf("read progress of %s: %w", jobID, err)
	}
	if len(entries) == 0 {
		return nil, nil
	}
	p := &Progress{}
	for _, e := range entries {
		if e.Event == nil {
			continue // informative only: skip what cannot be read
		}
		p.add(e.Event)
	}
	p.summarise()
	return p, nil
}

func (p *Progress) add(ev *messages.ProgressEvent) {
	p.Events++
	p.LastEvent = ev.Time
	switch ev.Type {
	case messages.EventRunStarted:
		// A new attempt starts over.
		*p = Progress{Events: p.Events, LastEvent: p.LastEvent, Attempt: p.Attempt + 1}
		return
	case messages.EventPlayStarted:
		p.CurrentPlay, p.CurrentTask = ev.Play, ""
		return
	case messages.EventTaskStarted:
		p.CurrentPlay, p.CurrentTask = ev.Play, ev.Task
		return
	}
	if !ev.Type.HostEvent() {
		return
	}
	if p.Tasks == nil {
		p.Tasks = map[string]*TaskCounts{}
	}
	c := p.Tasks[ev.Host]
	if c == nil {
		c = &TaskCounts{}
		p.Tasks[ev.Host] = c
	}
	switch ev.Type {
	case messages.EventHostOK:
		c.OK++
	case messages.EventHostChanged:
		c.Changed++
	case messages.EventHostFailed:
		if strings.HasPrefix(ev.Message, "(ignored) ") {
			c.OK++ // ignore_errors: the play goes on
		} else {
			c.Failed++
		}
	case messages.EventHostUnreachable:
		c.Unreachable++
	case messages.EventHostSkipped:
		c.Skipped++
	}
}

func (p *Progress) summarise() {
	p.HostsOK, p.HostsChanged, p.HostsFailed, p.HostsUnreachable = 0, 0, 0, 0
	for _, c := range p.Tasks {
		switch {
		case c.Unreachable > 0:
			p.HostsUnreachable++
		case c.Failed > 0:
			p.HostsFailed++
		case c.Changed > 0:
			p.HostsChanged++
		default:
			p.HostsOK++
		}
	}
}
