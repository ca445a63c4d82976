package deployments

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Group commit of submits. Every new deployment costs a committed INSERT
// (a WAL flush) and an XADD; submits that arrive while a group is being
// stored wait for the next group, which is stored with one multi-row
// INSERT (one statement, one round trip, one commit: a batch of one INSERT
// per row cost Postgres about half as much again), published with one
// pipelined XADD per entry in one round trip, and marked published with
// one row for the whole group. A lone submit goes out at once, as a group
// of one: nothing waits for a timer.
//
// Under sustained load (the inserter has just stored a group) and while
// the next group is small, the inserter lingers for commitLinger before it
// takes it, so that groups hold a few more submits: each group costs a
// statement, a commit, a pipeline and their round trips whatever its size,
// and at 2,000 submits/s half a millisecond cuts the CPU per submit of the
// deployer, Postgres and Redis together by about a quarter (BenchmarkSubmit)
// for about a millisecond more at the median. A submit that finds the
// inserter idle goes out at once.
//
// One group is stored at a time. Concurrent INSERTs into deployments all
// touch the same few index pages (every index ends in created_at or a
// UUIDv7), and on these 2-core machines four concurrent committers cost
// Postgres about 1.5 times the CPU per submit of one (BenchmarkSubmit at
// 2,000/s: 250-290 µs against 170 µs), which queued every request for
// CPU. One inserter lets the groups grow with the load instead. Publishing
// a stored group overlaps the storing of the next one.
const (
	// maxCommitGroup bounds the submits stored and published together.
	maxCommitGroup = 128
	// maxPublishing bounds the stored groups being published at once; the
	// inserter waits for a free slot before it stores another group.
	maxPublishing = 4
	// commitTimeout bounds storing and publishing one group.
	commitTimeout = 10 * time.Second
	// commitLinger is how long the busy inserter waits for a small group
	// to grow; lingerBelow is the size from which it does not wait.
	commitLinger = 500 * time.Microsecond
	lingerBelow  = 8
)

// commitItem is one submit waiting for its group.
type commitItem struct {
	row  deploymentRow
	data []byte // the encoded request, for the queue
	err  error  // the store's error; publishing failures are not the submit's
	// entry is the queue entry id the request was published as ("" when
	// publishing failed: the republisher publishes it later).
	entry string
	done  chan struct{}
}

// deploymentRow is a deployment submitted through the API, as stored.
type deploymentRow struct {
	id             string // also its job id
	keyID          string // "" for none
	projectID      string
	repoFullName   string
	branch         string
	serverIP       string
	port           int
	modules        []string
	githubTokenRef string
	secretsRef     string
	correlationID  string
	timeoutSeconds int // 0 for none
	callbackURL    string
	createdAt      time.Time
}

// args returns the arguments of insertDeployment; group is the id of the
// row's commit group ("" for none) and pos its position there (from 1).
func (r *deploymentRow) args(group string, pos int) []any {
	var timeout, position *int
	if r.timeoutSeconds > 0 {
		timeout = &r.timeoutSeconds
	}
	var groupID *string
	if group != "" {
		groupID, position = &group, &pos
	}
	return []any{r.id, nullUUID(r.keyID), r.projectID, r.repoFullName, r.branch, r.serverIP, r.port, r.modules,
		r.githubTokenRef, r.secretsRef, r.correlationID, timeout, r.callbackURL, r.createdAt, r.id, groupID, position}
}

// committer collects submits into groups (see the constants above).
type committer struct {
	s *Service

	mu      sync.Mutex
	queue   []*commitItem
	running bool // the inserter runs

	publishing chan struct{} // one token per group being published
}

func newCommitter(s *Service) *committer {
	return &committer{s: s, publishing: make(chan struct{}, maxPublishing)}
}

// commit stores and publishes it with the next group and waits until that
// is done. The wait does not end with ctx: once queued, the deployment is
// stored and published whether or not the client still waits (bounded by
// commitTimeout).
func (c *committer) commit(it *commitItem) error {
	it.done = make(chan struct{})
	c.mu.Lock()
	c.queue = append(c.queue, it)
	start := !c.running
	c.running = true
	c.mu.Unlock()
	if start {
		go c.run()
	}
	<-it.done
	return it.err
}

// run stores groups until the queue is empty (lingering between groups
// while they are small), and hands each stored group to a goroutine of its
// own to publish.
func (c *committer) run() {
	for busy := false; ; busy = true {
		if busy {
			c.mu.Lock()
			small := len(c.queue) < lingerBelow
			c.mu.Unlock()
			if small {
				time.Sleep(commitLinger)
			}
		}
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.running = false
			c.queue = nil // let a large backing array go
			c.mu.Unlock()
			return
		}
		n := min(len(c.queue), maxCommitGroup)
		group := c.queue[:n:n]
		c.queue = c.queue[n:]
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
		c.store(ctx, group)
		c.publishing <- struct{}{}
		go func() {
			defer func() { <-c.publishing }()
			defer cancel()
			c.publish(ctx, group)
		}()
	}
}

// store stores the group with one multi-row INSERT (each submit on its own
// when that fails, so that one bad row fails only its request); a submit
// that was not stored gets its error.
func (c *committer) store(ctx context.Context, group []*commitItem) {
	// The group is named after its first deployment (a fresh UUIDv7, so
	// never another group's name).
	groupID := group[0].row.id
	if err := c.insert(ctx, groupID, group); err != nil {
		if len(group) == 1 {
			group[0].err = err
			return
		}
		for i, it := range group {
			_, it.err = c.s.db.Exec(ctx, insertDeployment, it.row.args(groupID, i+1)...)
		}
	}
}

// publish publishes the stored submits of the group in one pipeline, marks
// the group published with one row (see the publish marker) and ends the
// submits' waits. A publishing failure is logged, not returned: the
// deployments are stored, and the republisher publishes them once Redis
// answers again.
func (c *committer) publish(ctx context.Context, group []*commitItem) {
	s := c.s
	defer func() {
		for _, it := range group {
			close(it.done)
		}
	}()
	data := make([][]byte, 0, len(group))
	for _, it := range group {
		if it.err == nil {
			data = append(data, it.data)
			// Stored, so the observer must skip it: known before the XADD,
			// which the observer may read before PublishBatch returns.
			s.own.add(it.row.id)
		}
	}
	if len(data) == 0 {
		return
	}
	s.metrics.commitGroup.Observe(float64(len(data)))
	published, err := s.producer.PublishBatch(ctx, s.cfg.Streams.Queue, data)
	if err != nil {
		s.metrics.publishFailures.Add(float64(len(data)))
		s.log.Warn().Err(err).Int("deployments", len(data)).Msg("publish deployments: will be retried by the republisher")
		return
	}
	entries := make([]string, len(group)) // by position; "" where not stored
	for i, it := range group {
		if it.err == nil {
			entries[i], published = published[0], published[1:]
			it.entry = entries[i]
		}
	}
	s.marker.markGroup(group[0].row.id, entries)
}

// insertGroup stores the deployments of a commit group, in one statement:
// the rows come as one array per column, and WITH ORDINALITY numbers them
// from 1 in order (their positions in the group).
const insertGroup = `
	INSERT INTO deployments (id, job_id, source, api_key_id, project_id, repo_full_name, branch, server_ip, port,
		modules, github_token_ref, secrets_ref, correlation_id, timeout_seconds, callback_url, created_at,
		publish_group, publish_pos)
	SELECT u.id, u.id::text, 'api', NULLIF(u.key_id, '')::uuid, u.project_id, u.repo, u.branch, u.server_ip, u.port,
		CASE WHEN u.modules = '' THEN NULL ELSE ARRAY(SELECT jsonb_array_elements_text(u.modules::jsonb)) END,
		NULLIF(u.token_ref, ''), NULLIF(u.secrets_ref, ''), NULLIF(u.correlation_id, ''), NULLIF(u.timeout, 0),
		NULLIF(u.callback_url, ''), u.created_at, $14, u.pos
	FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[], $8::text[],
		$9::text[], $10::text[], $11::text[], $12::int[], $13::text[], $15::timestamptz[])
		WITH ORDINALITY AS u(id, key_id, project_id, repo, branch, server_ip, port, modules,
			token_ref, secrets_ref, correlation_id, timeout, callback_url, created_at, pos)`

// insert stores the group's deployments with one statement and one
// commit.
func (c *committer) insert(ctx context.Context, groupID string, group []*commitItem) error {
	if len(group) == 1 {
		_, err := c.s.db.Exec(ctx, insertDeployment, group[0].row.args(groupID, 1)...)
		return err
	}
	n := len(group)
	ids, keys, projects, repos, branches, servers := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	ports, timeouts := make([]int, n), make([]int, n)
	modules, tokenRefs, secretsRefs, correlations, callbacks := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	created := make([]time.Time, n)
	for i, it := range group {
		r := &it.row
		ids[i], keys[i], projects[i], repos[i], branches[i], servers[i] = r.id, r.keyID, r.projectID, r.repoFullName, r.branch, r.serverIP
		ports[i], timeouts[i] = r.port, max(r.timeoutSeconds, 0) // 0 stores NULL
		if r.modules != nil {                                    // nil stays NULL; an empty list stays empty
			modules[i] = string(mustJSON(r.modules))
		}
		tokenRefs[i], secretsRefs[i], correlations[i], callbacks[i] = r.githubTokenRef, r.secretsRef, r.correlationID, r.callbackURL
		created[i] = r.createdAt
	}
	_, err := c.s.db.Exec(ctx, insertGroup, ids, keys, projects, repos, branches, servers, ports, modules,
		tokenRefs, secretsRefs, correlations, timeouts, callbacks, groupID, created)
	if err != nil {
		return fmt.Errorf("store %d deployments: %w", n, err)
	}
	return nil
}
