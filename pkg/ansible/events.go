package ansible

import (
	"bufio"
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
	Truncated bool `json:"truncated"`
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
	return ev, nil
}

// eventState is what a run learns from its events.
type eventState struct {
	count     int
	malformed int
	stats     map[string]Recap // from the stats event; nil before it
	derived   map[string]Recap // counted from host_* events
	failed    *FailedTask      // first non-ignored failure
	unreached *FailedTask      // first unreachable host
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
		if s.failed == nil {
			s.failed = &FailedTask{Name: ev.Task, Host: ev.Host, Play: ev.Play, Message: ev.Msg}
		}
	case EventHostUnreachable:
		rc.Unreachable++
		if s.unreached == nil {
			s.unreached = &FailedTask{Name: ev.Task, Host: ev.Host, Play: ev.Play, Message: ev.Msg}
		}
	case EventStats:
		if ev.Stats != nil {
			s.stats = ev.Stats
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
