package ansible

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"time"
)

// Event types written by the autoprov_events callback plugin
// (docs/events.md).
const (
	EventPlaybookStart   = "playbook_start"
	EventPlayStart       = "play_start"
	EventTaskStart       = "task_start"
	EventHandlerStart    = "handler_start"
	EventHostOK          = "host_ok"
	EventHostFailed      = "host_failed"
	EventHostUnreachable = "host_unreachable"
	EventHostSkipped     = "host_skipped"
	EventStats           = "stats"
)

// maxEventLine caps one event line; the plugin keeps lines under 64 KiB.
const maxEventLine = 1 << 20

// Event is one callback event. Text fields are already redacted.
type Event struct {
	// Seq numbers the events of a run from 1.
	Seq int
	// Time is when the plugin wrote the event.
	Time time.Time
	// Type is one of the Event* constants (or a newer type).
	Type string
	// Playbook is the playbook file name; Play, Task and Action name the
	// current play, task and module.
	Playbook, Play, Task, Action string
	// Host is the inventory host of host_* events.
	Host string
	// Msg is the short result text of host_* events.
	Msg string
	// Changed and IgnoreErrors come from host_* events.
	Changed, IgnoreErrors bool
	// RC is the command's return code when the module reported one.
	RC *int
	// Stats holds the per-host recap of the stats event.
	Stats map[string]Recap
	// Custom is the stats event's set_stats data of the run (per_host:
	// false), every string redacted; nil when the play set none.
	Custom map[string]any
}

// Recap is a host's line of the play recap.
type Recap struct {
	OK, Changed, Failed, Unreachable, Skipped, Rescued, Ignored int
}

// FailedTask names the first failure of a run.
type FailedTask struct {
	// Name is the task name, Host the inventory host, Play the play name.
	Name, Host, Play string
	// Message is the (redacted) failure message.
	Message string
}

// wireEvent is one line of the plugin's output.
type wireEvent struct {
	V            int    `json:"v"`
	Seq          int    `json:"seq"`
	TS           string `json:"ts"`
	Event        string `json:"event"`
	Playbook     string `json:"playbook"`
	Play         string `json:"play"`
	Task         string `json:"task"`
	Action       string `json:"action"`
	Host         string `json:"host"`
	Changed      bool   `json:"changed"`
	IgnoreErrors bool   `json:"ignore_errors"`
	Msg          string `json:"msg"`
	RC           *int   `json:"rc"`
	Hosts        map[string]struct {
		OK          int `json:"ok"`
		Changed     int `json:"changed"`
		Failed      int `json:"failed"`
		Unreachable int `json:"unreachable"`
		Skipped     int `json:"skipped"`
		Rescued     int `json:"rescued"`
		Ignored     int `json:"ignored"`
	} `json:"hosts"`
	Truncated bool            `json:"truncated"`
	Custom    json.RawMessage `json:"custom"`
}

// DecodeEvent parses one line of the autoprov_events stream
// (docs/events.md), as Run does; it fails on a line of another format
// version ("v" other than 1) or without an event type.
func DecodeEvent(line []byte) (Event, error) {
	return decodeEvent(line, func(s string) string { return s })
}

// decodeEvent parses one line and redacts its text.
func decodeEvent(line []byte, redact func(string) string) (Event, error) {
	var w wireEvent
	if err := json.Unmarshal(line, &w); err != nil {
		return Event{}, err
	}
	if w.V != 1 {
		return Event{}, errors.New("unknown event format version")
	}
	if w.Event == "" {
		return Event{}, errors.New("event without type")
	}
	ev := Event{
		Seq:          w.Seq,
		Type:         w.Event,
		Playbook:     redact(w.Playbook),
		Play:         redact(w.Play),
		Task:         redact(w.Task),
		Action:       redact(w.Action),
		Host:         redact(w.Host),
		Msg:          redact(w.Msg),
		Changed:      w.Changed,
		IgnoreErrors: w.IgnoreErrors,
		RC:           w.RC,
	}
	if t, err := time.Parse(time.RFC3339Nano, w.TS); err == nil {
		ev.Time = t
	}
	if w.Event == EventStats && !w.Truncated {
		ev.Stats = make(map[string]Recap, len(w.Hosts))
		for h, s := range w.Hosts {
			ev.Stats[redact(h)] = Recap{OK: s.OK, Changed: s.Changed, Failed: s.Failed,
				Unreachable: s.Unreachable, Skipped: s.Skipped, Rescued: s.Rescued, Ignored: s.Ignored}
		}
	}
	if w.Event == EventStats && len(w.Custom) > 0 {
		d := json.NewDecoder(bytes.NewReader(w.Custom))
		d.UseNumber()
		var custom map[string]any
		if err := d.Decode(&custom); err == nil && len(custom) > 0 {
			ev.Custom, _ = redactData(custom, redact).(map[string]any)
		}
	}
	return ev, nil
}

// redactData is v (JSON decoded with UseNumber) with every string, map
// key included, redacted, and numbers as int64 when whole, else float64.
func redactData(v any, redact func(string) string) any {
	switch v := v.(type) {
	case string:
		return redact(v)
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		f, _ := v.Float64()
		return f
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = redactData(e, redact)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[redact(k)] = redactData(e, redact)
		}
		return out
	default:
		return v
	}
}

// eventState is what a run learns from its events.
type eventState struct {
	count     int
	malformed int
	stats     map[string]Recap // from the stats event; nil before it
	custom    map[string]any   // the stats event's set_stats data
	derived   map[string]Recap // counted from host_* events
	// failures are each host's failures that were not ignored (rescued
	// ones too: only the stats event tells), unreachables its unreachable
	// results (those of tasks that ignore them too); see firstFailure.
	failures, unreachables map[string]*hostTrail
	// answered are the hosts with a result for the task running last
	// (emptied at each task's start): the others were still on it.
	answered map[string]bool
}

func (s *eventState) add(ev Event) {
	s.count++
	if s.derived == nil {
		s.derived = map[string]Recap{}
	}
	switch ev.Type {
	case EventTaskStart, EventHandlerStart:
		clear(s.answered)
	case EventHostOK, EventHostSkipped, EventHostFailed, EventHostUnreachable:
		if s.answered == nil {
			s.answered = map[string]bool{}
		}
		s.answered[ev.Host] = true
	}
	rc := s.derived[ev.Host]
	switch ev.Type {
	case EventHostOK:
		rc.OK++
		if ev.Changed {
			rc.Changed++
		}
	case EventHostSkipped:
		rc.Skipped++
	case EventHostFailed:
		if ev.IgnoreErrors {
			rc.Ignored++
			break
		}
		rc.Failed++
		s.failures = addTrail(s.failures, s.count, ev)
	case EventHostUnreachable:
		rc.Unreachable++
		s.unreachables = addTrail(s.unreachables, s.count, ev)
	case EventStats:
		if ev.Stats != nil {
			s.stats = ev.Stats
		}
		if ev.Custom != nil {
			s.custom = ev.Custom
		}
		return
	default:
		return
	}
	s.derived[ev.Host] = rc
}

// hosts is the per-host recap: the stats event's when there was one, else
// counted from host events (rescues are then unknown).
func (s *eventState) hosts() map[string]Recap {
	if s.stats != nil {
		return s.stats
	}
	return s.derived
}

// firstFailure is the first failed task that counts: not ignored, not
// rescued, on a host that was not unreachable (a host that could not be
// reached is unreachable, whatever its tasks did before). Nil when none.
func (s *eventState) firstFailure() *FailedTask {
	return s.first(s.failures, func(r Recap) int {
		if r.Unreachable > 0 {
			return 0
		}
		return r.Failed
	})
}

// firstUnreachable is the first unreachable result that counts (not of a
// task that ignores unreachable hosts). Nil when none.
func (s *eventState) firstUnreachable() *FailedTask {
	return s.first(s.unreachables, func(r Recap) int { return r.Unreachable })
}

// first is the earliest of the hosts' results in trails that the recap
// counts: count(recap) of each host's results count, its last ones. Its
// earlier ones are those the recap does not count as such: failures a
// rescue caught, unreachable results a task ignored. A host goes on after
// those and stops at one that counts; only its always sections run after
// that. Without a stats event the recap is counted from the events: every
// result counts, and the first one is the host's first.
func (s *eventState) first(trails map[string]*hostTrail, count func(Recap) int) *FailedTask {
	hosts := s.hosts()
	var best *trailEntry
	for h, t := range trails {
		if e := t.standing(count(hosts[h])); e != nil && (best == nil || e.seq < best.seq) {
			best = e
		}
	}
	if best == nil {
		return nil
	}
	ft := best.ft
	return &ft
}

// keptTrail is how many of a host's last results a hostTrail keeps: a
// standing failure and one of an always section after it. Messages are
// up to 32 KiB each, and a job has many hosts.
const keptTrail = 2

// hostTrail is a host's results of one kind (failed, unreachable): how
// many, the first and the last few, numbered in event order.
type hostTrail struct {
	n     int
	first trailEntry
	last  []trailEntry // oldest first, at most keptTrail
}

type trailEntry struct {
	seq int // the event's place in the run (eventState.count)
	ft  FailedTask
}

// addTrail adds the host event ev, the run's seq-th event, to its host's
// trail in trails (made when nil) and returns trails.
func addTrail(trails map[string]*hostTrail, seq int, ev Event) map[string]*hostTrail {
	if trails == nil {
		trails = map[string]*hostTrail{}
	}
	t := trails[ev.Host]
	if t == nil {
		t = &hostTrail{}
		trails[ev.Host] = t
	}
	e := trailEntry{seq: seq, ft: FailedTask{Name: ev.Task, Host: ev.Host, Play: ev.Play, Message: ev.Msg}}
	if t.n == 0 {
		t.first = e
	}
	t.n++
	if len(t.last) == keptTrail {
		t.last = append(t.last[:0], t.last[1:]...)
	}
	t.last = append(t.last, e)
	return trails
}

// standing is the first of the host's last count results: the first one
// that counts (the oldest kept when it is older than those).
func (t *hostTrail) standing(count int) *trailEntry {
	switch {
	case count <= 0 || t.n == 0:
		return nil
	case count >= t.n:
		return &t.first
	case count <= len(t.last):
		return &t.last[len(t.last)-count]
	}
	return &t.last[0]
}

// readLines calls fn with every line of r (without the newline) and
// touch() for every read. Lines longer than max are cut to max bytes and
// reported with long = true; the rest of such a line is dropped. fn must
// not keep line after it returns.
func readLines(r io.Reader, max int, touch func(), fn func(line []byte, long bool)) {
	br := bufio.NewReaderSize(r, 64*1024)
	var buf []byte
	long := false
	for {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 {
			touch()
			data := chunk
			nl := data[len(data)-1] == '\n'
			if nl {
				data = data[:len(data)-1]
			}
			if !long {
				if room := max - len(buf); len(data) > room {
					buf = append(buf, data[:room]...)
					long = true
				} else {
					buf = append(buf, data...)
				}
			}
			if nl {
				line := buf
				if n := len(line); n > 0 && line[n-1] == '\r' {
					line = line[:n-1]
				}
				fn(line, long)
				buf, long = buf[:0], false
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			if len(buf) > 0 {
				fn(buf, long)
			}
			return
		}
	}
}
