// Package cli holds the operators' subcommands of the scheduler binary,
// over pkg/fleet and the database:
//
//	scheduler servers list [--status S[,S]] [--source SRC] [--label k=v]... [--search TEXT] [--paused|--active] [--limit N] [--after HANDLE] [--json]
//	scheduler servers counts [filters] [--json]
//	scheduler servers show HANDLE [--json]
//	scheduler servers provision|recover|rebuild HANDLE [--reason TEXT] [--by NAME]
//	scheduler servers pause|resume HANDLE [--reason TEXT] [--by NAME]
//	scheduler servers set-projects HANDLE [--project ID]... [--reason TEXT] [--by NAME]
//
// Requests are recorded durably; the scheduler's loop turns them into
// messages (at most one job in flight per server). The network API of these
// operations is the deployer's HTTP API.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// Usage is the subcommands' help.
const Usage = `usage: scheduler servers COMMAND [flags]

commands:
  list      list servers:  --status S[,S] --source SRC (trailing * = prefix) --label k=v (k=* exists; repeatable)
            --search TEXT --paused --active --requested --project ID (- for fleet-only) --limit N (max 1000) --after HANDLE --json
  counts    servers per status, with the list's filters
  show      one server with its history and runs:  show HANDLE [--json]
  provision ask for a provisioning of HANDLE (setup and the rules' playbooks)
  recover   ask for a recovery of HANDLE (recovery.yml)
  rebuild   ask for a reinstall of HANDLE (force_reinstall) and a fresh setup
  pause     take HANDLE out of the loop and the health checks
  resume    put HANDLE back
  set-projects  set the projects that own HANDLE: --project ID (repeatable; none: fleet-only);
            refused for a server whose source sets them (autoprov_projects, autoprov:projects)
            (provision/recover/rebuild/pause/resume/set-projects take --reason TEXT and --by NAME; default --by is $USER)

The database is DATABASE_URL. Requests are recorded; the running scheduler acts on them at its next tick.
`

// Command is the subcommand of the scheduler binary that Main runs.
const Command = "servers"

// Summary is the one line `scheduler --help` shows for Command.
const Summary = "the fleet in DATABASE_URL: list, counts, show; provision, recover, rebuild, pause, resume a server, set its projects (scheduler servers --help)"

// Main runs `scheduler servers ARGS...` with the process's environment and
// output, and exits: 0 on success and after --help, 2 for usage errors, 1
// otherwise. SIGINT/SIGTERM cancel the command.
func Main(args []string) {
	ctx, stop := service.WithShutdownSignals(context.Background(), nil)
	err := Run(ctx, args, os.Getenv, os.Stdout, os.Stderr)
	stop()
	code := service.ExitCode(err)
	if code != 0 {
		fmt.Fprintf(os.Stderr, "scheduler servers: %v\n", err)
	}
	os.Exit(code)
}

// Run runs `scheduler servers ARGS...`.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, Usage)
		if len(args) == 0 {
			return &service.UsageError{Err: errors.New("servers: a command is required")}
		}
		return service.ErrHelp
	}
	cmd, rest := args[0], args[1:]
	fs := flag.NewFlagSet("servers "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		status, source, search, after, reason, by string
		labels, projects                          multi
		paused, active, requested, asJSON         bool
		limit                                     int
	)
	fs.StringVar(&status, "status", "", "statuses, comma-separated")
	fs.StringVar(&source, "source", "", "source")
	fs.Var(&labels, "label", "label k=v (k=* for existence), repeatable")
	fs.StringVar(&search, "search", "", "text in handle or address")
	fs.BoolVar(&paused, "paused", false, "only paused servers")
	fs.BoolVar(&active, "active", false, "only servers not paused")
	fs.BoolVar(&requested, "requested", false, "only servers with an open request")
	fs.Var(&projects, "project", "list: only the servers this project owns (- for fleet-only); set-projects: an owner, repeatable")
	fs.IntVar(&limit, "limit", 100, "page size")
	fs.StringVar(&after, "after", "", "list after this handle (the previous page's next)")
	fs.BoolVar(&asJSON, "json", false, "JSON output")
	fs.StringVar(&reason, "reason", "", "why (recorded in the history)")
	fs.StringVar(&by, "by", "", "who asks (default $USER)")
	// Flags may come before or after the handle.
	var positional []string
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return service.ErrHelp
			}
			return &service.UsageError{Err: err}
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if by == "" {
		by = cmpOr(getenv("USER"), "cli")
	}
	filter := fleet.Filter{Source: source, Search: search, Requested: requested}
	if cmd != "set-projects" && len(projects) > 0 {
		// The list's filter takes one project; set-projects, every owner.
		p := projects[len(projects)-1]
		if p != "-" {
			var ok bool
			if p, ok = canonicalProject(p); !ok {
				return &service.UsageError{Err: fmt.Errorf("servers %s: --project %q is not a project id", cmd, projects[len(projects)-1])}
			}
		}
		filter.Project = p
	}
	if status != "" {
		for _, s := range strings.Split(status, ",") {
			filter.Statuses = append(filter.Statuses, strings.ToUpper(strings.TrimSpace(s)))
		}
	}
	if paused || active {
		p := paused
		filter.Paused = &p
	}
	if len(labels) > 0 {
		filter.Labels = map[string]string{}
		for _, l := range labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				v = "*"
			}
			filter.Labels[k] = v
		}
	}

	dsn := cmpOr(getenv("DATABASE_URL"), service.DefaultDatabaseURL)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	db, err := store.Open(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	f := fleet.New(db, fleet.Options{})
	out := output{w: stdout, json: asJSON}

	needHandle := func() (string, error) {
		if len(positional) != 1 {
			return "", &service.UsageError{Err: fmt.Errorf("servers %s: one server handle is required", cmd)}
		}
		return positional[0], nil
	}
	switch cmd {
	case "list":
		page, err := f.List(ctx, filter, after, limit)
		if err != nil {
			return err
		}
		return out.list(page)
	case "counts":
		counts, err := f.Count(ctx, filter)
		if err != nil {
			return err
		}
		return out.counts(counts)
	case "show":
		h, err := needHandle()
		if err != nil {
			return err
		}
		d, err := f.Show(ctx, h, 20, 10)
		if err != nil {
			return err
		}
		return out.show(d)
	case "provision", "recover", "rebuild":
		h, err := needHandle()
		if err != nil {
			return err
		}
		action := map[string]fleet.Action{"provision": fleet.ActionProvision, "recover": fleet.ActionRecovery, "rebuild": fleet.ActionRebuild}[cmd]
		srv, err := f.RequestAction(ctx, h, action, by, reason)
		if err != nil {
			return err
		}
		return out.done(srv, fmt.Sprintf("%s of %s requested by %s; the scheduler queues it at its next tick", action, h, by))
	case "pause", "resume":
		h, err := needHandle()
		if err != nil {
			return err
		}
		op := f.Pause
		if cmd == "resume" {
			op = f.Resume
		}
		srv, err := op(ctx, h, by, reason)
		if err != nil {
			return err
		}
		return out.done(srv, fmt.Sprintf("%s %sd by %s", h, cmd, by))
	case "set-projects":
		h, err := needHandle()
		if err != nil {
			return err
		}
		srv, err := f.SetProjects(ctx, h, []string(projects), by, reason)
		if err != nil {
			return err
		}
		return out.done(srv, fmt.Sprintf("%s is owned by %s (set by %s)", h, ownersText(srv), by))
	}
	return &service.UsageError{Err: fmt.Errorf("servers: unknown command %q", cmd)}
}

// canonicalProject checks a project id (fleet.CanonicalProjects' rule).
func canonicalProject(p string) (string, bool) {
	list, err := fleet.CanonicalProjects([]string{p})
	if err != nil {
		return "", false
	}
	return list[0], true
}

// ownersText names a server's owners for people.
func ownersText(s *fleet.Server) string {
	if len(s.Projects) == 0 {
		return "no project (fleet-only)"
	}
	return strings.Join(s.Projects, ", ")
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

type output struct {
	w    io.Writer
	json bool
}

func (o output) encode(v any) error {
	enc := json.NewEncoder(o.w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// serverJSON is a server as the CLI prints it.
type serverJSON struct {
	Handle           string            `json:"handle"`
	Address          string            `json:"address"`
	SSHPort          int               `json:"ssh_port"`
	SSHUser          string            `json:"ssh_user"`
	Status           string            `json:"status"`
	Source           string            `json:"source"`
	Labels           map[string]string `json:"labels"`
	Paused           bool              `json:"paused"`
	Attempts         int               `json:"attempts"`
	LastError        string            `json:"last_error,omitempty"`
	LastJobID        string            `json:"last_job_id,omitempty"`
	PendingJobID     string            `json:"pending_job_id,omitempty"`
	PendingAction    string            `json:"pending_action,omitempty"`
	RequestedAction  string            `json:"requested_action,omitempty"`
	RequestedBy      string            `json:"requested_by,omitempty"`
	NextAttemptAt    *time.Time        `json:"next_attempt_at,omitempty"`
	RetriesExhausted bool              `json:"retries_exhausted,omitempty"`
	StatusChangedAt  time.Time         `json:"status_changed_at"`
	Version          int64             `json:"version"`
	// Projects own the server (empty: fleet-only); ProjectsFromSource: its
	// source sets them.
	Projects           []string `json:"projects"`
	ProjectsFromSource bool     `json:"projects_from_source"`
}

func toJSON(s *fleet.Server) serverJSON {
	j := serverJSON{Handle: s.Handle, Address: s.Address, SSHPort: s.SSHPort, SSHUser: s.SSHUser, Status: s.Status,
		Source: s.Source, Labels: s.Labels, Paused: s.Paused, Attempts: s.Attempts, LastError: s.LastError,
		LastJobID: s.LastJobID, PendingJobID: s.PendingJobID, PendingAction: string(s.PendingAction),
		RequestedAction: string(s.RequestedAction), RequestedBy: s.RequestedBy, RetriesExhausted: s.RetriesExhausted,
		StatusChangedAt: s.StatusChangedAt, Version: s.Version, Projects: s.Projects, ProjectsFromSource: s.ProjectsFromSource}
	if j.Projects == nil {
		j.Projects = []string{}
	}
	if !s.NextAttemptAt.IsZero() {
		t := s.NextAttemptAt
		j.NextAttemptAt = &t
	}
	return j
}

func (o output) list(p *fleet.Page) error {
	if o.json {
		list := make([]serverJSON, len(p.Servers))
		for i, s := range p.Servers {
			list[i] = toJSON(s)
		}
		return o.encode(map[string]any{"servers": list, "next": p.Next})
	}
	tw := tabwriter.NewWriter(o.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HANDLE\tSTATUS\tADDRESS\tSOURCE\tPROJECTS\tATTEMPTS\tNOTE")
	for _, s := range p.Servers {
		fmt.Fprintf(tw, "%s\t%s\t%s:%d\t%s\t%s\t%d\t%s\n", s.Handle, s.Status, s.Address, s.SSHPort, s.Source,
			projectsCell(s), s.Attempts, note(s))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if p.Next != "" {
		fmt.Fprintf(o.w, "more: --after %s\n", p.Next)
	}
	return nil
}

// projectsCell is the list's PROJECTS column: the owners' short ids (the
// first 8 hex digits), "-" for a fleet-only server.
func projectsCell(s *fleet.Server) string {
	if len(s.Projects) == 0 {
		return "-"
	}
	short := make([]string, len(s.Projects))
	for i, p := range s.Projects {
		short[i] = p[:8]
	}
	return strings.Join(short, ",")
}

func note(s *fleet.Server) string {
	var parts []string
	if s.Paused {
		parts = append(parts, "paused")
	}
	if s.RequestedAction != "" {
		parts = append(parts, "requested "+string(s.RequestedAction)+" by "+s.RequestedBy)
	}
	if s.PendingJobID != "" {
		parts = append(parts, "job "+s.PendingJobID)
	}
	if s.RetriesExhausted {
		parts = append(parts, "retries exhausted")
	}
	if s.LastError != "" && s.Status != fleet.StatusReady {
		e := s.LastError
		if len(e) > 60 {
			e = e[:57] + "..."
		}
		parts = append(parts, e)
	}
	return strings.Join(parts, "; ")
}

func (o output) counts(c map[string]int) error {
	if o.json {
		return o.encode(c)
	}
	keys := make([]string, 0, len(c))
	total := 0
	for k, n := range c {
		keys = append(keys, k)
		total += n
	}
	order := map[string]int{}
	for i, s := range fleet.Statuses() {
		order[s] = i
	}
	sort.Slice(keys, func(i, j int) bool { return order[keys[i]] < order[keys[j]] })
	for _, k := range keys {
		fmt.Fprintf(o.w, "%-13s %d\n", k, c[k])
	}
	fmt.Fprintf(o.w, "%-13s %d\n", "total", total)
	return nil
}

func (o output) show(d *fleet.Detail) error {
	if o.json {
		return o.encode(map[string]any{"server": toJSON(d.Server), "history": d.History, "runs": d.Runs})
	}
	s := d.Server
	fmt.Fprintf(o.w, "%s  %s  %s:%d (user %s)  source %s\n", s.Handle, s.Status, s.Address, s.SSHPort, s.SSHUser, s.Source)
	if n := note(s); n != "" {
		fmt.Fprintf(o.w, "  %s\n", n)
	}
	from := "set by an operator"
	if s.ProjectsFromSource {
		from = "set by its source"
	}
	fmt.Fprintf(o.w, "  projects: %s (%s)\n", ownersText(s), from)
	if len(s.Labels) > 0 {
		keys := make([]string, 0, len(s.Labels))
		for k := range s.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var kv []string
		for _, k := range keys {
			if s.Labels[k] == "" {
				kv = append(kv, k)
			} else {
				kv = append(kv, k+"="+s.Labels[k])
			}
		}
		fmt.Fprintf(o.w, "  labels: %s\n", strings.Join(kv, " "))
	}
	fmt.Fprintln(o.w, "history (newest first):")
	tw := tabwriter.NewWriter(o.w, 0, 4, 2, ' ', 0)
	for _, h := range d.History {
		fmt.Fprintf(tw, "  %s\t%s\t%s -> %s\t%s\t%s\t%s\n", h.At.Format(time.RFC3339), h.Event, cmpOr(h.From, "-"), h.To, h.Actor, h.JobID, h.Reason)
	}
	_ = tw.Flush()
	if len(d.Runs) > 0 {
		fmt.Fprintln(o.w, "runs (newest first):")
		for _, r := range d.Runs {
			fmt.Fprintf(o.w, "  %s  %s  %s %s %s\n", r.CreatedAt.Format(time.RFC3339), r.JobID, r.Playbook, r.State, r.Status)
		}
	}
	return nil
}

func (o output) done(s *fleet.Server, msg string) error {
	if o.json {
		return o.encode(toJSON(s))
	}
	_, err := fmt.Fprintln(o.w, msg)
	return err
}
