package cli

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// defaultStreams are the system's streams (pkg/messages).
var defaultStreams = []string{
	messages.StreamProvisionerQueue, messages.StreamAnsibleDeployQueue,
	messages.StreamProvisionerResults, messages.StreamDeployResults,
}

type statusCmd struct {
	Streams    []string      `name:"stream" short:"s" help:"stream to show (repeatable; default: the request and result streams)"`
	NoFleet    bool          `name:"no-fleet" help:"leave out the servers and runs (read from DATABASE_URL when it is set)"`
	StaleAfter time.Duration `name:"stale-after" help:"mark consumers idle longer than this as stale (default: the lease, STREAM_LEASE or 30s, whichever is longer)"`
}

// Help is the long help of autoprov status.
func (c *statusCmd) Help() string {
	return staleRule + `

CONSUMERS counts a group's consumers, the stale ones in brackets; each
consumer follows on its own line with its pending entries and idle time.`
}

// streamStatus is a stream's state as status prints it (--json: durations
// in seconds).
type streamStatus struct {
	Stream      string        `json:"stream"`
	Exists      bool          `json:"exists"`
	Length      int64         `json:"length"`
	DeadLetters int64         `json:"dead_letters"`
	Groups      []groupStatus `json:"groups"`
}

type groupStatus struct {
	Group string `json:"group"`
	// Lag is -1 when Redis cannot tell (entries deleted from the middle).
	Lag                  int64            `json:"lag"`
	Pending              int64            `json:"pending"`
	OldestPendingID      string           `json:"oldest_pending_id,omitempty"`
	OldestPendingAgeSec  float64          `json:"oldest_pending_age_seconds"`
	OldestPendingOwner   string           `json:"oldest_pending_consumer,omitempty"`
	OldestPendingDeliver int64            `json:"oldest_pending_deliveries,omitempty"`
	Consumers            []consumerStatus `json:"consumers"`
}

type consumerStatus struct {
	Name    string  `json:"name"`
	Pending int64   `json:"pending"`
	IdleSec float64 `json:"idle_seconds"`
	// Stale: idle beyond the stale threshold (see staleRule).
	Stale bool `json:"stale"`
}

func (c *statusCmd) Run(g *globals) error {
	rdb, err := g.redis()
	if err != nil {
		return err
	}
	defer rdb.Close()
	names := c.Streams
	if len(names) == 0 {
		names = defaultStreams
	}
	staleAfter, err := g.staleAfter(c.StaleAfter)
	if err != nil {
		return err
	}
	ins := stream.NewInspector(rdb)
	out := make([]streamStatus, 0, len(names))
	for _, name := range names {
		info, err := ins.Stream(g.ctx, name)
		if errors.Is(err, stream.ErrNotFound) {
			out = append(out, streamStatus{Stream: name, Groups: []groupStatus{}})
			continue
		}
		if err != nil {
			return err
		}
		out = append(out, statusOf(info, staleAfter))
	}
	note := staleNote(g.ctx, rdb)
	var fs *fleetStatus
	dsn, err := service.DatabaseURL(g.getenv) // DATABASE_URL or _FILE
	if err != nil {
		return err
	}
	if dsn != "" && !c.NoFleet {
		if fs, err = fleet(g.ctx, dsn); err != nil {
			return err
		}
	}
	if g.json {
		return writeJSON(g.env.Stdout, struct {
			Streams       []streamStatus `json:"streams"`
			StaleAfterSec float64        `json:"stale_after_seconds"`
			StaleNote     string         `json:"stale_note,omitempty"`
			*fleetStatus
		}{out, staleAfter.Seconds(), note, fs})
	}
	if err := c.printStreams(g, out); err != nil {
		return err
	}
	if note != "" && hasStale(out) {
		fmt.Fprintf(g.env.Stdout, "note: %s\n", note)
	}
	if fs != nil {
		return printFleet(g, fs)
	}
	return nil
}

func (c *statusCmd) printStreams(g *globals, out []streamStatus) error {
	t := newTable(g.env.Stdout, "STREAM", "LENGTH", "DEAD", "GROUP", "LAG", "PENDING", "OLDEST PENDING", "CONSUMERS")
	for _, s := range out {
		if !s.Exists {
			t.row(s.Stream, "-", "-", "(no such stream yet)", "", "", "", "")
			continue
		}
		if len(s.Groups) == 0 {
			t.row(s.Stream, itoa(s.Length), itoa(s.DeadLetters), "(no group)", "", "", "", "")
		}
		for k, gr := range s.Groups {
			name, length, dead := s.Stream, itoa(s.Length), itoa(s.DeadLetters)
			if k > 0 {
				name, length, dead = "", "", ""
			}
			lag := itoa(gr.Lag)
			if gr.Lag < 0 {
				lag = "?"
			}
			oldest := "-"
			if gr.OldestPendingID != "" {
				oldest = fmt.Sprintf("%s (%s, %d deliveries)", seconds(gr.OldestPendingAgeSec), gr.OldestPendingOwner, gr.OldestPendingDeliver)
			}
			stale := 0
			for _, cs := range gr.Consumers {
				if cs.Stale {
					stale++
				}
			}
			consumers := strconv.Itoa(len(gr.Consumers))
			if stale > 0 {
				consumers += fmt.Sprintf(" (%d stale)", stale)
			}
			t.row(name, length, dead, gr.Group, lag, itoa(gr.Pending), oldest, consumers)
			for _, cs := range gr.Consumers {
				idle := "idle " + seconds(cs.IdleSec)
				if cs.Stale {
					idle += " STALE"
				}
				t.row("", "", "", "  "+cs.Name, "", itoa(cs.Pending), idle, "")
			}
		}
	}
	return t.flush()
}

// hasStale reports whether some consumer of out is stale.
func hasStale(out []streamStatus) bool {
	for _, s := range out {
		for _, gr := range s.Groups {
			for _, c := range gr.Consumers {
				if c.Stale {
					return true
				}
			}
		}
	}
	return false
}

func statusOf(info *stream.StreamInfo, staleAfter time.Duration) streamStatus {
	s := streamStatus{Stream: info.Stream, Exists: true, Length: info.Length, DeadLetters: info.DeadLetters, Groups: []groupStatus{}}
	for _, gi := range info.Groups {
		gs := groupStatus{Group: gi.Group, Lag: gi.Lag, Pending: gi.Pending, Consumers: []consumerStatus{}}
		if p := gi.OldestPending; p != nil {
			gs.OldestPendingID, gs.OldestPendingAgeSec = p.ID, p.Age.Seconds()
			gs.OldestPendingOwner, gs.OldestPendingDeliver = p.Consumer, p.Deliveries
		}
		for _, c := range gi.Consumers {
			gs.Consumers = append(gs.Consumers, consumerStatus{Name: c.Name, Pending: c.Pending, IdleSec: c.Idle.Seconds(), Stale: c.Idle > staleAfter})
		}
		s.Groups = append(s.Groups, gs)
	}
	return s
}

// seconds renders a duration given in seconds, rounded for people.
func seconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}
