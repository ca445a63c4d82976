package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/user"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// deadReplayCmd appends a dead letter to its stream again. By default the
// entry goes back as it was: its data and its producer's signature
// unchanged, so the consumer checks the same signature it checked the
// first time. A dead letter refused for its signature (unsigned, bad
// signature) is not replayed unless the operator re-signs it with
// --resign, after seeing the decoded request and confirming it: a forged
// request must not turn into one the operator's key vouches for through a
// routine replay.
type deadReplayCmd struct {
	Stream    string `arg:"" help:"the stream, e.g. provisioner:queue"`
	ID        string `arg:"" help:"the dead letter's id"`
	Resign    bool   `name:"resign" help:"re-sign the request with autoprov's key (REQUEST_SIGNING_KEY_ID, REQUEST_SIGNING_KEY), with a new job id: the decoded request is shown and you are asked to confirm (y/N); needed for a dead letter refused for its signature"`
	Yes       bool   `name:"yes" help:"with --resign: do not ask, re-sign (the request is still shown)"`
	KeepJobID bool   `name:"keep-job-id" help:"with --resign: keep the request's job id (the handler may then skip it as done); without --resign the job id is always kept"`
	AsIs      bool   `name:"as-is" help:"replay a payload that does not decode as it is (it will likely be dead-lettered again)"`
}

// Help is the long help of `autoprov dead replay --help`.
func (c *deadReplayCmd) Help() string {
	return `Appends the dead letter to its stream again, once: its data and sig fields
unchanged (the consumer checks the producer's original signature again and
deduplicates by the request's job id), with replay_dead_id,
replay_original_id, replay_at and replay_by (the operator) naming its
origin.

A dead letter whose reason is a signature failure (` + messages.ReasonUnsigned + `, ` + messages.ReasonBadSignature + `: no
known producer signed it) is refused: it may be a forged request. Check it
with "autoprov dead show"; if you vouch for it, --resign signs it with
autoprov's own key and a new job id, after printing the decoded request
and asking for confirmation on the terminal (y/N); --yes confirms without
asking (scripts). Without a terminal and without --yes, --resign refuses.

Every replay, and every refused one, is logged as a JSON line on stderr
with the operator (OS user, and the key id when re-signed) and the dead
letter's id.`
}

// replayed is what a replay did, for the output and the log.
type replayed struct {
	originalID, reason string
	jobID, oldJobID    string
	resigned           bool
}

func (c *deadReplayCmd) Run(g *globals) error {
	switch {
	case c.Yes && !c.Resign:
		return usageError{errors.New("--yes confirms --resign; a replay without --resign re-signs nothing")}
	case c.Resign && c.AsIs:
		return usageError{errors.New("--resign signs a request it decodes and shows; --as-is replays one that does not decode")}
	}
	name, ins, done, err := g.deadLetters(c.Stream)
	if err != nil {
		return err
	}
	defer done()
	op := operator(g.env)
	log := zerolog.New(g.env.Stderr).With().Timestamp().Str("service", "autoprov").Str("command", "dead replay").
		Str("operator", op).Str("stream", name).Str("dead_id", c.ID).Bool("resign", c.Resign).Logger()
	var keyID string
	var sign func(string, []byte) (string, error)
	if c.Resign {
		if keyID, sign, err = g.signingKey(); err != nil {
			return err
		}
		if sign == nil {
			return usageError{errors.New("--resign needs autoprov's signing key: set REQUEST_SIGNING_KEY_ID and REQUEST_SIGNING_KEY (or REQUEST_SIGNING_KEY_FILE)")}
		}
		log = log.With().Str("key_id", keyID).Logger()
	}
	var r replayed
	newID, err := ins.Replay(g.ctx, name, c.ID, func(d *stream.DeadLetter) (map[string]any, error) {
		return c.values(g, name, d, op, keyID, sign, &r)
	})
	if err != nil {
		log.Warn().Str("original_id", r.originalID).Str("dead_reason", r.reason).Err(err).Msg("dead letter not replayed")
		return err
	}
	log.Info().Str("original_id", r.originalID).Str("dead_reason", r.reason).Str("new_id", newID).
		Str("job_id", r.jobID).Str("original_job_id", r.oldJobID).Bool("resigned", r.resigned).Msg("dead letter replayed")
	out := struct {
		Stream   string `json:"stream"`
		DeadID   string `json:"dead_id"`
		NewID    string `json:"new_id"`
		NewJobID string `json:"job_id,omitempty"`
		Operator string `json:"operator"`
		Resigned bool   `json:"resigned"`
		KeyID    string `json:"key_id,omitempty"`
	}{name, c.ID, newID, r.jobID, op, r.resigned, keyID}
	if g.json {
		return writeJSON(g.env.Stdout, out)
	}
	fmt.Fprintf(g.env.Stdout, "replayed %s as %s on %s", c.ID, newID, name)
	if r.jobID != "" {
		fmt.Fprintf(g.env.Stdout, " (job %s)", r.jobID)
	}
	if r.resigned {
		fmt.Fprintf(g.env.Stdout, ", re-signed with key %s", keyID)
	}
	fmt.Fprintln(g.env.Stdout)
	return nil
}

// values returns the fields of the replayed entry: the dead letter's own,
// unchanged, or (--resign) a request re-signed with sign once the operator
// confirmed it. Both carry the operator in stream.ReplayFieldBy.
func (c *deadReplayCmd) values(g *globals, name string, d *stream.DeadLetter, op, keyID string, sign func(string, []byte) (string, error), r *replayed) (map[string]any, error) {
	r.originalID, r.reason = d.OriginalID, d.Reason
	if messages.IsSignatureReason(d.Reason) && !c.Resign {
		return nil, fmt.Errorf("refused: it was dead-lettered for its signature (%s: %s), so no known producer vouches for it; "+
			"read it with `autoprov dead show %s %s`, and only if you vouch for it re-sign it with --resign", d.Reason, d.Error, name, d.ID)
	}
	values := maps.Clone(d.Values)
	values[stream.ReplayFieldBy] = op
	msg, meta, err := decodeRequest(name, d.Data())
	switch {
	case err != nil && c.Resign:
		return nil, fmt.Errorf("payload does not decode (%v): nothing to show and re-sign", err)
	case err != nil && c.AsIs:
		return values, nil
	case err != nil:
		return nil, fmt.Errorf("payload does not decode (%v); --as-is replays it unchanged", err)
	case meta != nil:
		r.jobID, r.oldJobID = meta.JobID, meta.JobID
	}
	if !c.Resign {
		return values, nil // data and sig as the producer wrote them
	}
	if msg == nil {
		return nil, fmt.Errorf("--resign: %s is not a request stream; its entries are not signed", name)
	}
	data := d.Data()
	if !c.KeepJobID {
		meta.JobID = uuid.NewString()
		if data, err = messages.Encode(msg); err != nil {
			return nil, fmt.Errorf("encode: %w", err)
		}
		r.jobID = meta.JobID
	}
	if err := c.confirm(g, name, d, keyID, r, data); err != nil {
		return nil, err
	}
	sig, err := sign(name, data)
	if err != nil {
		return nil, err
	}
	values[messages.DataField] = data
	values[stream.SigField] = sig
	r.resigned = true
	return values, nil
}

// confirm prints the request about to be signed (decoded, as JSON: a
// request holds secret references, never values) on stderr and asks the
// operator, unless --yes. Without a terminal to ask on, it refuses.
func (c *deadReplayCmd) confirm(g *globals, name string, d *stream.DeadLetter, keyID string, r *replayed, data []byte) error {
	w := g.env.Stderr
	fmt.Fprintf(w, "dead letter %s of %s (entry %s, reason %s: %s)\n", d.ID, name, d.OriginalID, orDash(d.Reason), orDash(d.Error))
	fmt.Fprintf(w, "request to re-sign with key %s as job %s (was %s):\n", keyID, r.jobID, orDash(r.oldJobID))
	if err := writeJSON(w, decodePayload(data)); err != nil {
		return err
	}
	if c.Yes {
		return nil
	}
	if !interactive(g.env.Stdin) {
		return errors.New("not re-signed: no terminal to confirm on; pass --yes to re-sign without asking")
	}
	fmt.Fprint(w, "Re-sign this request with your key and replay it? [y/N] ")
	line, err := bufio.NewReader(g.env.Stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read the answer: %w", err)
	}
	if _, tty := g.env.Stdin.(*os.File); !tty {
		fmt.Fprintln(w) // nothing echoed the answer's newline
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return errors.New("not re-signed: not confirmed; nothing replayed")
}

// decodeRequest decodes the payload of a request stream's entry and
// returns the message and its request metadata; nil ones for another
// stream.
func decodeRequest(name string, data []byte) (any, *messages.RequestMeta, error) {
	switch name {
	case messages.StreamProvisionerQueue:
		m, err := messages.DecodeProvisionerMessage(data)
		if err != nil {
			return nil, nil, err
		}
		return m, &m.RequestMeta, nil
	case messages.StreamAnsibleDeployQueue:
		m, err := messages.DecodeAnsibleDeployMessage(data)
		if err != nil {
			return nil, nil, err
		}
		return m, &m.RequestMeta, nil
	}
	return nil, nil, nil
}

// interactive reports whether answers can be read from r: a terminal, or
// a reader the embedding program gave (not a file).
func interactive(r io.Reader) bool {
	if r == nil {
		return false
	}
	if f, ok := r.(*os.File); ok {
		return isTerminal(f)
	}
	return true
}

// operator names who runs autoprov: the OS user (the account's name, or
// $USER, or the uid).
func operator(env Env) string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if u := env.Getenv("USER"); u != "" {
		return u
	}
	return "uid:" + strconv.Itoa(os.Getuid())
}
