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
	Streams []string `name:"stream" short:"s" help:"stream to show (repeatable; default: the request and result streams)"`
	NoFleet bool     `name:"no-fleet" help:"leave out the servers and runs (read from DATABASE_URL when it is set)"`
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
		out = append(out, statusOf(info))
	}
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
			Streams []streamStatus `json:"streams"`
			*fleetStatus
		}{out, fs})
	}
	if err := c.printStreams(g, out); err != nil {
		return err
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
			t.row(name, length, dead, gr.Group, lag, itoa(gr.Pending), oldest, strconv.Itoa(len(gr.Consumers)))
			for _, cs := range gr.Consumers {
				t.row("", "", "", "  "+cs.Name, "", itoa(cs.Pending), "idle "+seconds(cs.IdleSec), "")
			}
		}
	}
	return t.flush()
}

func statusOf(info *stream.StreamInfo) streamStatus {
	s := streamStatus{Stream: info.Stream, Exists: true, Length: info.Length, DeadLetters: info.DeadLetters, Groups: []groupStatus{}}
	for _, gi := range info.Groups {
		gs := groupStatus{Group: gi.Group, Lag: gi.Lag, Pending: gi.Pending, Consumers: []consumerStatus{}}
		if p := gi.OldestPending; p != nil {
			gs.OldestPendingID, gs.OldestPendingAgeSec = p.ID, p.Age.Seconds()
			gs.OldestPendingOwner, gs.OldestPendingDeliver = p.Consumer, p.Deliveries
		}
		for _, c := range gi.Consumers {
			gs.Consumers = append(gs.Consumers, consumerStatus{Name: c.Name, Pending: c.Pending, IdleSec: c.Idle.Seconds()})
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
