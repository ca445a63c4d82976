package cli

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// deadCmd groups the dead-letter commands. STREAM is the stream whose dead
// letters they act on (provisioner:queue; its dead letters are in
// provisioner:queue:dead).
type deadCmd struct {
	List   deadListCmd   `cmd:"" help:"list dead letters, oldest first"`
	Show   deadShowCmd   `cmd:"" help:"show one dead letter with its decoded payload"`
	Replay deadReplayCmd `cmd:"" help:"append a dead letter to its stream again, with a new job id and its origin recorded (once per dead letter)"`
	Drop   deadDropCmd   `cmd:"" help:"delete dead letters"`
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
	name, ins, done, err := g.deadLetters(c.Stream)
	if err != nil {
		return err
	}
	defer done()
	page, err := ins.DeadLetters(g.ctx, name, c.After, c.Limit)
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

type deadReplayCmd struct {
	Stream    string `arg:"" help:"the stream, e.g. provisioner:queue"`
	ID        string `arg:"" help:"the dead letter's id"`
	KeepJobID bool   `name:"keep-job-id" help:"keep the request's job id (the handler may then skip it as done)"`
	AsIs      bool   `name:"as-is" help:"replay a payload that does not decode as it is (it will likely be dead-lettered again)"`
}

func (c *deadReplayCmd) Run(g *globals) error {
	name, ins, done, err := g.deadLetters(c.Stream)
	if err != nil {
		return err
	}
	defer done()
	sign, err := g.signer()
	if err != nil {
		return err
	}
	var jobID string
	rewrite := func(d *stream.DeadLetter) (map[string]any, error) {
		data, id, err := c.rewrite(name, d.Data())
		if err != nil {
			return nil, err
		}
		jobID = id
		values := make(map[string]any, len(d.Values))
		for k, v := range d.Values {
			values[k] = v
		}
		if data != nil {
			// A new payload: the producer's signature of the old one no
			// longer holds; autoprov signs it with its own key, if any.
			values[messages.DataField] = data
			delete(values, stream.SigField)
			if sign != nil {
				sig, err := sign(name, data)
				if err != nil {
					return nil, err
				}
				values[stream.SigField] = sig
			}
		}
		return values, nil
	}
	newID, err := ins.Replay(g.ctx, name, c.ID, rewrite)
	if err != nil {
		return err
	}
	out := struct {
		Stream   string `json:"stream"`
		DeadID   string `json:"dead_id"`
		NewID    string `json:"new_id"`
		NewJobID string `json:"job_id,omitempty"`
	}{name, c.ID, newID, jobID}
	if g.json {
		return writeJSON(g.env.Stdout, out)
	}
	fmt.Fprintf(g.env.Stdout, "replayed %s as %s on %s", c.ID, newID, name)
	if jobID != "" {
		fmt.Fprintf(g.env.Stdout, " (job %s)", jobID)
	}
	fmt.Fprintln(g.env.Stdout)
	return nil
}

// rewrite returns the payload to replay and its job id: a request of the
// system's request streams gets a new job id (unless --keep-job-id), so the
// handler's deduplication does not take it for the request that died. nil
// data keeps the payload.
func (c *deadReplayCmd) rewrite(name string, data []byte) ([]byte, string, error) {
	var meta *messages.RequestMeta
	var msg any
	var err error
	switch name {
	case messages.StreamProvisionerQueue:
		var m *messages.ProvisionerMessage
		if m, err = messages.DecodeProvisionerMessage(data); err == nil {
			meta, msg = &m.RequestMeta, m
		}
	case messages.StreamAnsibleDeployQueue:
		var m *messages.AnsibleDeployMessage
		if m, err = messages.DecodeAnsibleDeployMessage(data); err == nil {
			meta, msg = &m.RequestMeta, m
		}
	default:
		return nil, "", nil // not a request stream: replayed as it was
	}
	if err != nil {
		if c.AsIs {
			return nil, "", nil
		}
		return nil, "", fmt.Errorf("payload does not decode (%v); --as-is replays it unchanged", err)
	}
	if c.KeepJobID {
		return nil, meta.JobID, nil
	}
	meta.JobID = uuid.NewString()
	out, err := messages.Encode(msg)
	if err != nil {
		return nil, "", fmt.Errorf("encode: %w", err)
	}
	return out, meta.JobID, nil
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
