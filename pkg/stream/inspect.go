package stream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotFound is returned (wrapped) for a stream, group or dead letter that
// does not exist.
var ErrNotFound = errors.New("stream: not found")

// ErrReplayed is returned (wrapped) by Inspector.Replay for a dead letter
// that was replayed already.
var ErrReplayed = errors.New("stream: dead letter already replayed")

// ReplaysSuffix is appended to a stream's name to form the hash that
// records which of its dead letters were replayed: field the dead letter's
// id, value "<new id> <time>" (or "pending <time>" while a replay runs).
const ReplaysSuffix = DeadLetterSuffix + ":replays"

// Fields added to an entry that Inspector.Replay appends, next to the
// fields its rewrite returned, so that its origin is known.
const (
	ReplayFieldDeadID     = "replay_dead_id"     // the dead letter's id in the dead-letter stream
	ReplayFieldOriginalID = "replay_original_id" // the id of the entry that was dead-lettered
	ReplayFieldAt         = "replay_at"          // when it was replayed (RFC 3339)
	ReplayFieldBy         = "replay_by"          // who replayed it (set by the caller: autoprov's operator)
)

// Inspector reads the state of streams, their consumer groups and their
// dead letters, and acts on dead letters: what an operator's command line
// or an admin API shows and does. It works on any Redis deployment.
type Inspector struct {
	rdb redis.UniversalClient
	pub *Producer
}

// NewInspector returns an Inspector that works through rdb. Replayed
// entries are appended like a default Producer does (see
// DefaultSafetyMaxLen).
func NewInspector(rdb redis.UniversalClient) *Inspector {
	return &Inspector{rdb: rdb, pub: NewProducer(rdb, ProducerOptions{})}
}

// StreamInfo describes a stream and its consumer groups.
type StreamInfo struct {
	Stream      string
	Length      int64  // entries in the stream
	FirstID     string // oldest entry ("" when empty)
	LastID      string // newest entry ("" when empty)
	DeadLetters int64  // entries in its dead-letter stream
	Groups      []GroupInfo
}

// GroupInfo describes a consumer group of a stream.
type GroupInfo struct {
	Group           string
	LastDeliveredID string
	EntriesRead     int64
	// Lag counts the entries not yet delivered to the group; -1 when Redis
	// cannot tell (entries were deleted from the middle of the stream).
	Lag int64
	// Pending counts the entries delivered and not yet acknowledged.
	Pending int64
	// OldestPending is the oldest pending entry, nil when none is pending.
	OldestPending *PendingEntry
	Consumers     []ConsumerInfo
}

// PendingEntry describes an entry delivered to a group and not yet
// acknowledged.
type PendingEntry struct {
	ID         string
	Consumer   string        // its owner
	Idle       time.Duration // since its owner last read, claimed or renewed it
	Deliveries int64
	Age        time.Duration // since it was appended (from its id, by Redis's clock)
}

// ConsumerInfo describes a consumer of a group.
type ConsumerInfo struct {
	Name    string
	Pending int64         // entries it holds
	Idle    time.Duration // since it last read or claimed
}

// Stream describes stream and all its groups. A stream that does not exist
// is ErrNotFound.
func (i *Inspector) Stream(ctx context.Context, stream string) (*StreamInfo, error) {
	pipe := i.rdb.Pipeline()
	infoCmd := pipe.XInfoStream(ctx, stream)
	deadCmd := pipe.XLen(ctx, stream+DeadLetterSuffix)
	groups, now, err := i.groupsAt(ctx, pipe, stream)
	if err != nil {
		return nil, err
	}
	info, err := infoCmd.Result()
	if err != nil {
		return nil, fmt.Errorf("xinfo stream %s: %w", stream, err)
	}
	dead, err := deadCmd.Result()
	if err != nil {
		return nil, fmt.Errorf("xlen %s: %w", stream+DeadLetterSuffix, err)
	}
	si := &StreamInfo{
		Stream: stream, Length: info.Length, DeadLetters: dead,
		FirstID: info.FirstEntry.ID, LastID: info.LastEntry.ID,
	}
	if si.Groups, err = i.groups(ctx, stream, groups, now); err != nil {
		return nil, err
	}
	return si, nil
}

// Group describes one group of stream. A stream or group that does not
// exist is ErrNotFound.
func (i *Inspector) Group(ctx context.Context, stream, group string) (*GroupInfo, error) {
	groups, now, err := i.groupsAt(ctx, i.rdb.Pipeline(), stream)
	if err != nil {
		return nil, err
	}
	for _, g := range groups {
		if g.Name == group {
			gi, err := i.groups(ctx, stream, []redis.XInfoGroup{g}, now)
			if err != nil {
				return nil, err
			}
			return &gi[0], nil
		}
	}
	return nil, fmt.Errorf("group %s of stream %s: %w", group, stream, ErrNotFound)
}

// groupsAt adds the reads of stream's groups and of Redis's clock to pipe,
// runs it, and returns them. A stream that does not exist is ErrNotFound.
func (i *Inspector) groupsAt(ctx context.Context, pipe redis.Pipeliner, stream string) ([]redis.XInfoGroup, time.Time, error) {
	groupsCmd := pipe.XInfoGroups(ctx, stream)
	timeCmd := pipe.Time(ctx)
	_, _ = pipe.Exec(ctx)
	groups, err := groupsCmd.Result()
	if err != nil {
		if isNoSuchKey(err) {
			return nil, time.Time{}, fmt.Errorf("stream %s: %w", stream, ErrNotFound)
		}
		return nil, time.Time{}, fmt.Errorf("xinfo groups %s: %w", stream, err)
	}
	now, err := timeCmd.Result()
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("time: %w", err)
	}
	return groups, now, nil
}

// groups completes the given groups of stream with their consumers and
// oldest pending entry, in one round trip.
func (i *Inspector) groups(ctx context.Context, stream string, groups []redis.XInfoGroup, now time.Time) ([]GroupInfo, error) {
	if len(groups) == 0 {
		return nil, nil
	}
	pipe := i.rdb.Pipeline()
	consumers := make([]*redis.XInfoConsumersCmd, len(groups))
	oldest := make([]*redis.XPendingExtCmd, len(groups))
	for k, g := range groups {
		consumers[k] = pipe.XInfoConsumers(ctx, stream, g.Name)
		oldest[k] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: g.Name, Start: "-", End: "+", Count: 1})
	}
	_, _ = pipe.Exec(ctx)
	out := make([]GroupInfo, len(groups))
	for k, g := range groups {
		cs, err := consumers[k].Result()
		if err != nil {
			return nil, fmt.Errorf("xinfo consumers %s %s: %w", stream, g.Name, err)
		}
		ps, err := oldest[k].Result()
		if err != nil && !isNil(err) {
			return nil, fmt.Errorf("xpending %s %s: %w", stream, g.Name, err)
		}
		gi := GroupInfo{
			Group: g.Name, LastDeliveredID: g.LastDeliveredID, EntriesRead: g.EntriesRead,
			Lag: g.Lag, Pending: g.Pending,
		}
		for _, c := range cs {
			gi.Consumers = append(gi.Consumers, ConsumerInfo{Name: c.Name, Pending: c.Pending, Idle: c.Idle})
		}
		if len(ps) > 0 {
			p := ps[0]
			gi.OldestPending = &PendingEntry{ID: p.ID, Consumer: p.Consumer, Idle: p.Idle, Deliveries: p.RetryCount, Age: ageOf(p.ID, now)}
		}
		out[k] = gi
	}
	return out, nil
}

// ageOf returns how long before now the entry id was appended.
func ageOf(id string, now time.Time) time.Duration {
	sid, err := parseID(id)
	if err != nil {
		return 0
	}
	return max(now.Sub(time.UnixMilli(int64(sid.ms))), 0)
}

// DeadLetter is an entry of a stream's dead-letter stream.
type DeadLetter struct {
	// ID is its id in the dead-letter stream.
	ID string
	// Stream and OriginalID name the entry that was dead-lettered.
	Stream     string
	OriginalID string
	// Group and Consumer name who gave up on it.
	Group, Consumer string
	// Reason is the short machine-readable reason ("max_deliveries",
	// "invalid_message", ...); Error the last error.
	Reason, Error string
	Deliveries    int64
	At            time.Time // when it was dead-lettered
	// Values holds the original entry's fields.
	Values map[string]any
	// Replay tells when and as which entry it was replayed; nil if never.
	Replay *ReplayRecord
}

// Data returns the original entry's DataField, or nil.
func (d *DeadLetter) Data() []byte {
	m := Message{Values: d.Values}
	return m.Data()
}

// ReplayRecord records the replay of a dead letter.
type ReplayRecord struct {
	// NewID is the id of the entry appended to the original stream; empty
	// when the replay was interrupted before it was appended or recorded
	// (look for an entry whose ReplayFieldDeadID is the dead letter's id).
	NewID string
	At    time.Time
}

// DeadLetterPage is one page of a dead-letter listing.
type DeadLetterPage struct {
	Letters []DeadLetter
	// Next is the cursor of the next page; "" when this page is the last.
	Next string
}

// DeadLetters lists the dead letters of stream, oldest first: up to count
// of them (default 100) after the cursor after ("" for the start; a page's
// Next for the following page).
func (i *Inspector) DeadLetters(ctx context.Context, stream, after string, count int) (*DeadLetterPage, error) {
	if count <= 0 {
		count = 100
	}
	start := "-"
	if after != "" {
		if _, err := parseID(after); err != nil {
			return nil, fmt.Errorf("cursor: %w", err)
		}
		start = "(" + after
	}
	dead := stream + DeadLetterSuffix
	msgs, err := i.rdb.XRangeN(ctx, dead, start, "+", int64(count)).Result()
	if err != nil {
		return nil, fmt.Errorf("xrange %s: %w", dead, err)
	}
	page := &DeadLetterPage{Letters: make([]DeadLetter, len(msgs))}
	for k, m := range msgs {
		page.Letters[k] = deadLetterOf(m)
	}
	if err := i.addReplays(ctx, stream, page.Letters); err != nil {
		return nil, err
	}
	if len(msgs) == count {
		page.Next = msgs[len(msgs)-1].ID
	}
	return page, nil
}

// DeadLetter returns the dead letter id of stream; ErrNotFound when there is
// none.
func (i *Inspector) DeadLetter(ctx context.Context, stream, id string) (*DeadLetter, error) {
	if _, err := parseID(id); err != nil {
		return nil, err
	}
	dead := stream + DeadLetterSuffix
	msgs, err := i.rdb.XRangeN(ctx, dead, id, id, 1).Result()
	if err != nil {
		return nil, fmt.Errorf("xrange %s: %w", dead, err)
	}
	if len(msgs) == 0 {
		return nil, fmt.Errorf("dead letter %s of %s: %w", id, stream, ErrNotFound)
	}
	dl := []DeadLetter{deadLetterOf(msgs[0])}
	if err := i.addReplays(ctx, stream, dl); err != nil {
		return nil, err
	}
	return &dl[0], nil
}

// Replay appends the dead letter id of stream to stream again, as a new
// entry, and returns its id. rewrite returns the new entry's fields from
// the dead letter (for example the payload with a new job id, so that the
// handler's deduplication does not skip it); nil keeps the original fields.
// The new entry carries the ReplayField* fields naming its origin, and the
// replay is recorded (see DeadLetter.Replay): a dead letter is replayed
// once, a second Replay is ErrReplayed. The dead letter itself stays until
// Drop.
func (i *Inspector) Replay(ctx context.Context, stream, id string, rewrite func(*DeadLetter) (map[string]any, error)) (string, error) {
	dl, err := i.DeadLetter(ctx, stream, id)
	if err != nil {
		return "", err
	}
	if dl.Replay != nil {
		return "", fmt.Errorf("dead letter %s of %s (as %q at %s): %w", id, stream, dl.Replay.NewID, dl.Replay.At.Format(time.RFC3339), ErrReplayed)
	}
	values := dl.Values
	if rewrite != nil {
		if values, err = rewrite(dl); err != nil {
			return "", fmt.Errorf("rewrite dead letter %s of %s: %w", id, stream, err)
		}
	}
	now := time.Now().UTC()
	fields := make(map[string]any, len(values)+3)
	for k, v := range values {
		fields[k] = v
	}
	fields[ReplayFieldDeadID] = id
	fields[ReplayFieldOriginalID] = dl.OriginalID
	fields[ReplayFieldAt] = now.Format(time.RFC3339Nano)

	// Claim the replay first, so that two operators cannot both replay it;
	// then append; then record the new id.
	replays := stream + ReplaysSuffix
	claimed, err := i.rdb.HSetNX(ctx, replays, id, "pending "+now.Format(time.RFC3339Nano)).Result()
	if err != nil {
		return "", fmt.Errorf("hsetnx %s: %w", replays, err)
	}
	if !claimed {
		return "", fmt.Errorf("dead letter %s of %s: %w", id, stream, ErrReplayed)
	}
	newID, err := i.pub.PublishValues(ctx, stream, fields)
	if err != nil {
		// Nothing was appended (or, rarely, it was and the reply was lost):
		// let the replay be tried again.
		if derr := i.rdb.HDel(context.WithoutCancel(ctx), replays, id).Err(); derr != nil {
			err = errors.Join(err, fmt.Errorf("undo replay claim: %w", derr))
		}
		return "", err
	}
	if err := i.rdb.HSet(context.WithoutCancel(ctx), replays, id, newID+" "+now.Format(time.RFC3339Nano)).Err(); err != nil {
		return newID, fmt.Errorf("replayed as %s but not recorded: %w", newID, err)
	}
	return newID, nil
}

// Drop deletes dead letters of stream and their replay records, and returns
// how many dead letters it deleted.
func (i *Inspector) Drop(ctx context.Context, stream string, ids ...string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	for _, id := range ids {
		if _, err := parseID(id); err != nil {
			return 0, err
		}
	}
	dead := stream + DeadLetterSuffix
	n, err := i.rdb.XDel(ctx, dead, ids...).Result()
	if err != nil {
		return 0, fmt.Errorf("xdel %s: %w", dead, err)
	}
	if err := i.rdb.HDel(ctx, stream+ReplaysSuffix, ids...).Err(); err != nil {
		return n, fmt.Errorf("hdel %s: %w", stream+ReplaysSuffix, err)
	}
	return n, nil
}

// addReplays fills the Replay records of letters.
func (i *Inspector) addReplays(ctx context.Context, stream string, letters []DeadLetter) error {
	if len(letters) == 0 {
		return nil
	}
	ids := make([]string, len(letters))
	for k := range letters {
		ids[k] = letters[k].ID
	}
	vals, err := i.rdb.HMGet(ctx, stream+ReplaysSuffix, ids...).Result()
	if err != nil {
		return fmt.Errorf("hmget %s: %w", stream+ReplaysSuffix, err)
	}
	for k, v := range vals {
		s, ok := v.(string)
		if !ok {
			continue
		}
		newID, at, _ := strings.Cut(s, " ")
		rec := &ReplayRecord{NewID: newID}
		if newID == "pending" {
			rec.NewID = ""
		}
		rec.At, _ = time.Parse(time.RFC3339Nano, at)
		letters[k].Replay = rec
	}
	return nil
}

// deadLetterOf parses a dead-letter entry.
func deadLetterOf(m redis.XMessage) DeadLetter {
	str := func(k string) string { s, _ := m.Values[k].(string); return s }
	dl := DeadLetter{
		ID:         m.ID,
		Stream:     str(DeadFieldStream),
		OriginalID: str(DeadFieldID),
		Group:      str(DeadFieldGroup),
		Consumer:   str(DeadFieldConsumer),
		Reason:     str(DeadFieldReason),
		Error:      str(DeadFieldError),
		Values:     make(map[string]any, len(m.Values)),
	}
	dl.Deliveries, _ = strconv.ParseInt(str(DeadFieldDeliveries), 10, 64)
	dl.At, _ = time.Parse(time.RFC3339Nano, str(DeadFieldAt))
	for k, v := range m.Values {
		if !isDeadField(k) {
			dl.Values[k] = v
		}
	}
	return dl
}

func isDeadField(k string) bool {
	switch k {
	case DeadFieldReason, DeadFieldError, DeadFieldStream, DeadFieldID, DeadFieldGroup,
		DeadFieldConsumer, DeadFieldDeliveries, DeadFieldAt:
		return true
	}
	return false
}
