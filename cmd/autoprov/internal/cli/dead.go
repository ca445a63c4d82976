package cli

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// deadCmd groups the dead-letter commands. STREAM is the stream whose dead
// letters they act on (provisioner:queue; its dead letters are in
// provisioner:queue:dead).
type deadCmd struct {
	List   deadListCmd   `cmd:"" help:"list dead letters, oldest first (a stream that is not the system's and has neither entries nor dead letters is an error naming the known ones)"`
	Show   deadShowCmd   `cmd:"" help:"show one dead letter with its decoded payload"`
	Replay deadReplayCmd `cmd:"" help:"append a dead letter to its stream again, its data and signature unchanged, its origin and operator recorded (once per dead letter); one refused for its signature only with --resign"`
	Drop   deadDropCmd   `cmd:"" help:"delete dead letters"`
}

// Help is the long help of `autoprov dead --help`.
func (d *deadCmd) Help() string {
	return `Dead letters of STREAM are in STREAM:dead. A replay sends the entry back with
its data and signature unchanged, once, and logs the operator and the dead
letter's id; a dead letter refused for its signature (` + messages.ReasonUnsigned + `, ` + messages.ReasonBadSignature + `)
is replayed only re-signed by the operator (replay --resign, after a
confirmation). See "autoprov dead replay --help".`
}

// streamName accepts a stream's name or its dead-letter stream's name.
func streamName(s string) (string, error) {
	s = strings.TrimSuffix(s, stream.DeadLetterSuffix)
	if s == "" {
		return "", usageError{errors.New("empty stream name")}
	}
	return s, nil
}

// deadLetters returns the stream whose dead letters a command acts on and
// an Inspector on Redis; done closes the connection.
func (g *globals) deadLetters(arg string) (name string, ins *stream.Inspector, done func(), err error) {
	if name, err = streamName(arg); err != nil {
		return "", nil, nil, err
	}
	rdb, err := g.redis()
	if err != nil {
		return "", nil, nil, err
	}
	return name, stream.NewInspector(rdb), func() { _ = rdb.Close() }, nil
}

type deadListCmd struct {
	Stream string `arg:"" help:"the stream, e.g. provisioner:queue"`
	After  string `help:"list the dead letters after this id (the next page)"`
	Limit  int    `default:"50" help:"at most this many"`
}

// letterView is a dead letter as list, show and --json print it.
type letterView struct {
	ID         string         `json:"id"`
	Stream     string         `json:"stream"`
	OriginalID string         `json:"original_id"`
	Group      string         `json:"group"`
	Consumer   string         `json:"consumer"`
	Reason     string         `json:"reason"`
	Error      string         `json:"error"`
	Deliveries int64          `json:"deliveries"`
	At         time.Time      `json:"at"`
	ReplayedAs string         `json:"replayed_as,omitempty"`
	ReplayedAt *time.Time     `json:"replayed_at,omitempty"`
	Payload    any            `json:"payload,omitempty"`
	Fields     map[string]any `json:"fields,omitempty"`
}

func viewOf(d *stream.DeadLetter, withPayload bool) letterView {
	v := letterView{
		ID: d.ID, Stream: d.Stream, OriginalID: d.OriginalID, Group: d.Group, Consumer: d.Consumer,
		Reason: d.Reason, Error: d.Error, Deliveries: d.Deliveries, At: d.At,
	}
	if d.Replay != nil {
		v.ReplayedAs = d.Replay.NewID
		if v.ReplayedAs == "" {
			v.ReplayedAs = "(interrupted)"
		}
		at := d.Replay.At
		v.ReplayedAt = &at
	}
	if withPayload {
		v.Payload = decodePayload(d.Data())
		v.Fields = map[string]any{}
		for k, val := range d.Values {
			if k != messages.DataField {
				v.Fields[k] = val
			}
		}
	}
	return v
}

// decodePayload turns a msgpack payload into a JSON-friendly value; bytes
// that do not decode are shown as a quoted string.
func decodePayload(data []byte) any {
	if data == nil {
		return nil
	}
	var v any
	if err := msgpack.Unmarshal(data, &v); err != nil {
		return fmt.Sprintf("(not msgpack: %q)", data)
	}
	return jsonable(v)
}

// jsonable converts msgpack's generic maps to ones encoding/json accepts.
func jsonable(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = jsonable(e)
		}
		return t
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, e := range t {
			m[fmt.Sprint(k)] = jsonable(e)
		}
		return m
	case []any:
		for k, e := range t {
			t[k] = jsonable(e)
		}
		return t
	case []byte:
		return fmt.Sprintf("%q", t)
	}
	return v
}

func (c *deadListCmd) Run(g *globals) error {
	name, err := streamName(c.Stream)
	if err != nil {
		return err
	}
	rdb, err := g.redis()
	if err != nil {
		return err
	}
	defer rdb.Close()
	if err := checkKnownStream(g.ctx, rdb, name); err != nil {
		return err
	}
	page, err := stream.NewInspector(rdb).DeadLetters(g.ctx, name, c.After, c.Limit)
	if err != nil {
		return err
	}
	views := make([]letterView, len(page.Letters))
	for k := range page.Letters {
		views[k] = viewOf(&page.Letters[k], false)
	}
	if g.json {
		return writeJSON(g.env.Stdout, struct {
			Letters []letterView `json:"letters"`
			Next    string       `json:"next,omitempty"`
		}{views, page.Next})
	}
	t := newTable(g.env.Stdout, "ID", "AT", "REASON", "DELIVERIES", "GROUP", "REPLAYED AS", "ERROR")
	for _, v := range views {
		t.row(v.ID, v.At.UTC().Format(time.RFC3339), v.Reason, itoa(v.Deliveries), v.Group, orDash(v.ReplayedAs), v.Error)
	}
	if err := t.flush(); err != nil {
		return err
	}
	if page.Next != "" {
		fmt.Fprintf(g.env.Stdout, "more: autoprov dead list %s --after %s\n", name, page.Next)
	}
	return nil
}

type deadShowCmd struct {
	Stream string `arg:"" help:"the stream, e.g. provisioner:queue"`
	ID     string `arg:"" help:"the dead letter's id (in the dead-letter stream)"`
}

func (c *deadShowCmd) Run(g *globals) error {
	name, ins, done, err := g.deadLetters(c.Stream)
	if err != nil {
		return err
	}
	defer done()
	d, err := ins.DeadLetter(g.ctx, name, c.ID)
	if err != nil {
		return err
	}
	v := viewOf(d, true)
	if g.json {
		return writeJSON(g.env.Stdout, v)
	}
	t := newTable(g.env.Stdout, "FIELD", "VALUE")
	t.row("id", v.ID)
	t.row("stream", v.Stream)
	t.row("original id", v.OriginalID)
	t.row("group / consumer", v.Group+" / "+v.Consumer)
	t.row("reason", v.Reason)
	t.row("deliveries", itoa(v.Deliveries))
	t.row("dead-lettered at", v.At.UTC().Format(time.RFC3339Nano))
	if v.ReplayedAt != nil {
		t.row("replayed", v.ReplayedAs+" at "+v.ReplayedAt.UTC().Format(time.RFC3339))
	}
	keys := make([]string, 0, len(v.Fields))
	for k := range v.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.row("field "+k, fmt.Sprint(v.Fields[k]))
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintf(g.env.Stdout, "error:\n  %s\npayload:\n", strings.ReplaceAll(v.Error, "\n", "\n  "))
	return writeJSON(g.env.Stdout, v.Payload)
}

type deadDropCmd struct {
	Stream string   `arg:"" help:"the stream, e.g. provisioner:queue"`
	IDs    []string `arg:"" name:"id" help:"dead letter ids"`
}

func (c *deadDropCmd) Run(g *globals) error {
	name, ins, done, err := g.deadLetters(c.Stream)
	if err != nil {
		return err
	}
	defer done()
	n, err := ins.Drop(g.ctx, name, c.IDs...)
	if err != nil {
		return err
	}
	if g.json {
		return writeJSON(g.env.Stdout, map[string]int64{"dropped": n})
	}
	fmt.Fprintf(g.env.Stdout, "dropped %d of %d dead letters from %s%s\n", n, len(c.IDs), name, stream.DeadLetterSuffix)
	if n < int64(len(c.IDs)) {
		return fmt.Errorf("%d of the ids were not dead letters of %s", int64(len(c.IDs))-n, name)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
