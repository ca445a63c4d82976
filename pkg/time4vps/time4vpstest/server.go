// Package time4vpstest is an in-memory stand-in of the Time4VPS User API for
// tests, built from its public documentation (billing.time4vps.com/userapi)
// and the official PHP library and WHMCS module.
//
// It serves, under <URL()>, with HTTP basic auth:
//
//	GET  /server                        active servers (array of summaries)
//	GET  /server/{id}                   server details, active_task, last_tasks
//	GET  /server/{id}/oses              OS templates
//	GET  /server/{id}/task/{task_id}    task result (task_id may also be a task name)
//	POST /server/{id}/reinstall         {"os", "ssh_key", "script"} -> {"task_id"}
//	POST /server/{id}/reboot            -> {"task_id"}
//
// Tasks complete after Config.TaskPolls polls of their status, or after
// Config.TaskDuration, and fail when FailNextTask asked for it. Faults (5xx,
// 429 with Retry-After, delays, dropped connections) are injected per endpoint,
// and every request is counted per endpoint. What is documented and what is
// assumed is listed in docs/time4vps.md.
package time4vpstest

import (
	"cmp"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
)

// Endpoint keys, for Count and Fault.Endpoint.
const (
	EndpointListServers = "GET /server"
	EndpointServer      = "GET /server/{id}"
	EndpointOSes        = "GET /server/{id}/oses"
	EndpointTask        = "GET /server/{id}/task/{task_id}"
	EndpointReinstall   = "POST /server/{id}/reinstall"
	EndpointReboot      = "POST /server/{id}/reboot"
	// EndpointOther counts requests that match no route.
	EndpointOther = "other"
)

// Defaults for Config.
const (
	DefaultUsername  = "api@example.com"
	DefaultPassword  = "Stand-in-Passw0rd-4f2c"
	DefaultTaskPolls = 2
)

// Task names the API uses (from the official WHMCS module).
const (
	TaskReinstall = "server_recreate"
	TaskReboot    = "server_reboot"
)

// Error messages. "wronglogin" and "Invalid task ID" are the strings the
// official PHP library checks for; the others are assumed wording.
const (
	MsgWrongLogin     = "wronglogin"
	MsgInvalidTask    = "Invalid task ID"
	MsgServerNotFound = "Server not found"
	MsgOSRequired     = "Operating System is required"
	MsgInvalidOS      = "Invalid Operating System"
	MsgServerBusy     = "Server is busy: another task is in progress"
)

// OS is an OS template, as GET /server/{id}/oses returns it.
type OS struct {
	OS    string `json:"os"`
	Title string `json:"title"`
}

// DefaultOSes is the template list of a server added without OSes.
var DefaultOSes = []OS{
	{OS: "kvm-ubuntu-24.04-gpt-x86_64", Title: "Ubuntu 24.04"},
	{OS: "kvm-debian-12-x86_64", Title: "Debian 12"},
	{OS: "centos-7-x86_64", Title: "Centos 7"},
}

// Config configures the stand-in; zero fields take defaults.
type Config struct {
	// Username and Password are the accepted basic auth credentials.
	Username string
	Password string
	// TaskPolls is the number of status polls after which a task completes
	// (default 2). Ignored when TaskDuration is set.
	TaskPolls int
	// TaskDuration, when set, completes a task that long after it started.
	TaskDuration time.Duration
	// AppErrorStatus is the HTTP status of application errors (bad OS, busy
	// server, invalid task ID). Default 200: the official library looks for
	// errors in the body, never at the status (assumed).
	AppErrorStatus int
	// Clock is the stand-in's clock (default: the system clock).
	Clock clock.Clock
}

// VPS is a server of the stand-in. Zero fields take defaults in AddServer.
type VPS struct {
	ID            int64
	Domain        string
	IP            string
	AdditionalIPs []string
	Label         string
	Type          string // default "KVM"
	Status        string // default "Active"; only "Active" servers are listed
	OS            string
	PackageID     int
	CPUCores      int // default 1
	CPUFrequency  int // default 2400
	RAMLimit      int // MB, default 2048
	DiskLimit     int // MB, default 20480
	BWLimit       int // MB, default 1048576
	DNSServers    []string
	OSes          []OS // default DefaultOSes
	DateCreated   string
}

// DropMode says when a faulty request's connection is closed.
type DropMode int

// Drop modes.
const (
	// NoDrop answers normally (or with Fault.Status).
	NoDrop DropMode = iota
	// DropBeforeHandling reads the request and closes the connection without
	// acting on it.
	DropBeforeHandling
	// DropAfterHandling acts on the request (a reinstall starts) and closes the
	// connection without answering: the case that makes retrying a POST unsafe.
	DropAfterHandling
)

// Fault makes the next Times requests to Endpoint misbehave.
type Fault struct {
	// Endpoint is one of the Endpoint constants; "" matches every request.
	Endpoint string
	// Times is how many matching requests it applies to (default 1).
	Times int
	// Delay is waited before anything else (the wait ends early when the
	// client gives up).
	Delay time.Duration
	// Status, when set, is returned instead of handling the request.
	Status int
	// Body is the body sent with Status (default {"error":["<status text>"]}).
	Body string
	// RetryAfter is the Retry-After header sent with Status.
	RetryAfter string
	// Drop closes the connection instead of answering.
	Drop DropMode
}

// TaskInfo is a task as the stand-in holds it, for test assertions.
type TaskInfo struct {
	ID       int64
	ServerID int64
	Name     string
	OS       string // for reinstall tasks
	Polls    int
	Done     bool
	Failed   bool
	// Results is the completion text; a reinstall's holds a root password.
	Results string
}

// ReinstallCall is an accepted reinstall request.
type ReinstallCall struct {
	ServerID int64
	OS       string
	SSHKey   string
	Script   int64
}

type task struct {
	id, serverID int64
	name, os     string
	activated    time.Time
	assigned     time.Time
	completed    time.Time
	results      string
	polls        int
	fail         bool
	failMsg      string
}

type vpsState struct {
	VPS
	activeTask int64
	lastTasks  []int64 // most recent first
}

// Server is a running stand-in. Its methods are safe for concurrent use.
type Server struct {
	cfg  Config
	hs   *httptest.Server
	done chan struct{}
	once sync.Once

	mu         sync.Mutex
	servers    map[int64]*vpsState
	tasks      map[int64]*task
	nextTaskID int64
	failNext   []string
	reinstalls []ReinstallCall
	faults     []*Fault
	counts     map[string]int
	total      int
}

// New starts a stand-in; Close it when done (or use Start).
func New(cfg Config) *Server {
	cfg.Username = cmp.Or(cfg.Username, DefaultUsername)
	cfg.Password = cmp.Or(cfg.Password, DefaultPassword)
	if cfg.TaskPolls <= 0 {
		cfg.TaskPolls = DefaultTaskPolls
	}
	cfg.AppErrorStatus = cmp.Or(cfg.AppErrorStatus, http.StatusOK)
	cfg.Clock = cmp.Or(cfg.Clock, clock.System())
	s := &Server{
		cfg:        cfg,
		done:       make(chan struct{}),
		servers:    map[int64]*vpsState{},
		tasks:      map[int64]*task{},
		nextTaskID: 1000,
		counts:     map[string]int{},
	}
	mux := http.NewServeMux()
	s.route(mux, "GET /api/server", EndpointListServers, s.listServers)
	s.route(mux, "GET /api/server/{id}", EndpointServer, s.getServer)
	s.route(mux, "GET /api/server/{id}/oses", EndpointOSes, s.getOSes)
	s.route(mux, "GET /api/server/{id}/task/{task_id}", EndpointTask, s.getTask)
	s.route(mux, "POST /api/server/{id}/reinstall", EndpointReinstall, s.reinstall)
	s.route(mux, "POST /api/server/{id}/reboot", EndpointReboot, s.reboot)
	s.route(mux, "/", EndpointOther, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusNotFound, errorBody("Route not found"))
	})
	s.hs = httptest.NewServer(mux)
	return s
}

// Start starts a stand-in that is closed when the test ends.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	s := New(cfg)
	t.Cleanup(s.Close)
	return s
}

// URL is the API base URL, such as http://127.0.0.1:port/api.
func (s *Server) URL() string { return s.hs.URL + "/api" }

// Username returns the accepted username.
func (s *Server) Username() string { return s.cfg.Username }

// Password returns the accepted password.
func (s *Server) Password() string { return s.cfg.Password }

// Close stops the server; pending delays end at once.
func (s *Server) Close() {
	s.once.Do(func() {
		close(s.done)
		s.hs.CloseClientConnections()
		s.hs.Close()
	})
}

// AddServer adds or replaces a server.
func (s *Server) AddServer(v VPS) {
	if v.Type == "" {
		v.Type = "KVM"
	}
	if v.Status == "" {
		v.Status = "Active"
	}
	if v.CPUCores == 0 {
		v.CPUCores = 1
	}
	if v.CPUFrequency == 0 {
		v.CPUFrequency = 2400
	}
	if v.RAMLimit == 0 {
		v.RAMLimit = 2048
	}
	if v.DiskLimit == 0 {
		v.DiskLimit = 20480
	}
	if v.BWLimit == 0 {
		v.BWLimit = 1048576
	}
	if v.OSes == nil {
		v.OSes = slices.Clone(DefaultOSes)
	}
	if v.DateCreated == "" {
		v.DateCreated = s.cfg.Clock.Now().UTC().Format("2006-01-02")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.servers[v.ID] = &vpsState{VPS: v}
}

// UpdateServer changes a server in place (say, a new IP); false if unknown.
func (s *Server) UpdateServer(id int64, f func(*VPS)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.servers[id]
	if ok {
		f(&v.VPS)
	}
	return ok
}

// ServerState returns a copy of a server as it is now (its OS changes when a
// reinstall completes).
func (s *Server) ServerState(id int64) (VPS, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.servers[id]
	if !ok {
		return VPS{}, false
	}
	return v.VPS, true
}

// FailNextTask makes the next task created fail with message.
func (s *Server) FailNextTask(message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext = append(s.failNext, message)
}

// Tasks returns every task created, in creation order.
func (s *Server) Tasks() []TaskInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]TaskInfo, 0, len(s.tasks))
	for _, t := range s.tasks {
		out = append(out, TaskInfo{
			ID: t.id, ServerID: t.serverID, Name: t.name, OS: t.os, Polls: t.polls,
			Done: !t.completed.IsZero(), Failed: t.fail && !t.completed.IsZero(), Results: t.results,
		})
	}
	slices.SortFunc(out, func(a, b TaskInfo) int { return int(a.ID - b.ID) })
	return out
}

// Reinstalls returns the accepted reinstall requests, in order.
func (s *Server) Reinstalls() []ReinstallCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reinstalls)
}

// Count returns how many requests reached endpoint (one of the Endpoint
// constants), including refused and faulty ones.
func (s *Server) Count(endpoint string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[endpoint]
}

// TotalRequests returns how many requests reached the server.
func (s *Server) TotalRequests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// InjectFault queues a fault; faults apply in the order they were queued.
func (s *Server) InjectFault(f Fault) {
	if f.Times <= 0 {
		f.Times = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &f)
}

// FailNext answers the next times requests to endpoint with status.
func (s *Server) FailNext(endpoint string, times, status int) {
	s.InjectFault(Fault{Endpoint: endpoint, Times: times, Status: status})
}

// RateLimitNext answers the next times requests to endpoint with 429 and the
// Retry-After header retryAfter (seconds or an HTTP date; "" for none).
func (s *Server) RateLimitNext(endpoint string, times int, retryAfter string) {
	s.InjectFault(Fault{Endpoint: endpoint, Times: times, Status: http.StatusTooManyRequests, RetryAfter: retryAfter})
}

// DropNext closes the connection of the next times requests to endpoint.
func (s *Server) DropNext(endpoint string, times int, mode DropMode) {
	s.InjectFault(Fault{Endpoint: endpoint, Times: times, Drop: mode})
}

// DelayNext delays the next times requests to endpoint by d, then handles them.
func (s *Server) DelayNext(endpoint string, times int, d time.Duration) {
	s.InjectFault(Fault{Endpoint: endpoint, Times: times, Delay: d})
}

// route registers h under pattern, counting requests as key and applying
// faults and basic auth before h.
func (s *Server) route(mux *http.ServeMux, pattern, key string, h http.HandlerFunc) {
	mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		f := s.count(key)
		if f != nil {
			if f.Delay > 0 {
				t := time.NewTimer(f.Delay)
				select {
				case <-t.C:
				case <-r.Context().Done():
					t.Stop()
					return
				case <-s.done:
					t.Stop()
					return
				}
			}
			switch {
			case f.Drop == DropBeforeHandling:
				_, _ = io.Copy(io.Discard, r.Body)
				hijackClose(w)
				return
			case f.Drop == DropAfterHandling:
				s.authorized(httptest.NewRecorder(), r, h)
				hijackClose(w)
				return
			case f.Status != 0:
				if f.RetryAfter != "" {
					w.Header().Set("Retry-After", f.RetryAfter)
				}
				body := f.Body
				if body == "" {
					b, _ := json.Marshal(errorBody(http.StatusText(f.Status)))
					body = string(b)
				}
				if strings.HasPrefix(strings.TrimSpace(body), "{") {
					w.Header().Set("Content-Type", "application/json")
				} else {
					w.Header().Set("Content-Type", "text/html; charset=utf-8")
				}
				w.WriteHeader(f.Status)
				_, _ = io.WriteString(w, body)
				return
			}
		}
		s.authorized(w, r, h)
	})
}

func (s *Server) authorized(w http.ResponseWriter, r *http.Request, h http.HandlerFunc) {
	user, pass, ok := r.BasicAuth()
	if !ok ||
		subtle.ConstantTimeCompare([]byte(user), []byte(s.cfg.Username)) != 1 ||
		subtle.ConstantTimeCompare([]byte(pass), []byte(s.cfg.Password)) != 1 {
		writeJSON(w, http.StatusUnauthorized, errorBody(MsgWrongLogin))
		return
	}
	h(w, r)
}

// count records a request and returns the fault that applies to it, if any.
func (s *Server) count(key string) *Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[key]++
	s.total++
	for i, f := range s.faults {
		if f.Endpoint != "" && f.Endpoint != key {
			continue
		}
		f.Times--
		if f.Times <= 0 {
			s.faults = slices.Delete(s.faults, i, i+1)
		}
		cp := *f
		return &cp
	}
	return nil
}

func hijackClose(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("time4vpstest: response writer cannot hijack")
	}
	conn, _, err := hj.Hijack()
	if err == nil {
		_ = conn.Close()
	}
}

func errorBody(msgs ...string) map[string][]string { return map[string][]string{"error": msgs} }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) appError(w http.ResponseWriter, msg string) {
	writeJSON(w, s.cfg.AppErrorStatus, errorBody(msg))
}

// isoTime formats t as the docs show dates: 2018-05-31T10:25:24+00:00; "" for zero.
func isoTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05-07:00")
}

func (s *Server) listServers(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	now := s.cfg.Clock.Now()
	ids := make([]int64, 0, len(s.servers))
	for id, v := range s.servers {
		if v.Status == "Active" {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	out := make([]map[string]any, 0, len(ids))
	for _, id := range ids {
		v := s.servers[id]
		out = append(out, map[string]any{
			"server_id":    v.ID,
			"domain":       v.Domain,
			"ip":           v.IP,
			"date_created": v.DateCreated,
			"synch_date":   now.UTC().Format("2006-01-02 15:04:05"),
			"label":        v.Label,
			"type":         v.Type,
		})
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

// lookup returns the server named by the {id} path value, or answers 404.
// The caller holds s.mu.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request) *vpsState {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	v, ok := s.servers[id]
	if err != nil || !ok {
		writeJSON(w, http.StatusNotFound, errorBody(MsgServerNotFound))
		return nil
	}
	return v
}

func (s *Server) getServer(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.lookup(w, r)
	if v == nil {
		return
	}
	now := s.cfg.Clock.Now()
	var active any
	if v.activeTask != 0 {
		t := s.tasks[v.activeTask]
		s.advance(t, now, false)
		if t.completed.IsZero() {
			active = taskJSON(t)
		}
	}
	var last any
	if len(v.lastTasks) > 0 {
		lt := make([]map[string]string, 0, len(v.lastTasks))
		for _, id := range v.lastTasks {
			lt = append(lt, taskJSON(s.tasks[id]))
		}
		last = lt
	}
	additional := v.AdditionalIPs
	if additional == nil {
		additional = []string{}
	}
	var dns any
	if len(v.DNSServers) > 0 {
		dns = v.DNSServers
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"synch_date":    isoTime(now),
		"package_id":    v.PackageID,
		"domain":        v.Domain,
		"label":         v.Label,
		"status":        v.Status,
		"cpu_frequency": v.CPUFrequency,
		"cpu_cores":     v.CPUCores,
		"ram_limit":     v.RAMLimit,
		"ram_used":      v.RAMLimit / 8,
		"disk_limit":    v.DiskLimit,
		"disk_usage":    v.DiskLimit / 16,
		"bw_limit":      v.BWLimit,
		"bw_in":         0,
		"bw_out":        0,
		"os":            v.OS,
		"ip":            v.IP,
		"additional_ip": additional,
		"dns_servers":   dns,
		"components":    []map[string]any{{"id": 123, "name": "Daily and weekly backups", "selected": false}},
		"active_task":   active,
		"last_tasks":    last,
	})
}

func (s *Server) getOSes(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.lookup(w, r)
	if v == nil {
		return
	}
	writeJSON(w, http.StatusOK, v.OSes)
}

func (s *Server) getTask(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.lookup(w, r)
	if v == nil {
		return
	}
	ref := r.PathValue("task_id")
	var t *task
	if id, err := strconv.ParseInt(ref, 10, 64); err == nil {
		if c := s.tasks[id]; c != nil && c.serverID == v.ID {
			t = c
		}
	} else {
		// The WHMCS module asks for the latest task of a kind by name.
		for _, c := range s.tasks {
			if c.serverID == v.ID && c.name == ref && (t == nil || c.id > t.id) {
				t = c
			}
		}
	}
	if t == nil {
		s.appError(w, MsgInvalidTask)
		return
	}
	s.advance(t, s.cfg.Clock.Now(), true)
	writeJSON(w, http.StatusOK, taskJSON(t))
}

func (s *Server) reinstall(w http.ResponseWriter, r *http.Request) {
	params, err := readParams(r)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody("Invalid request body"))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.lookup(w, r)
	if v == nil {
		return
	}
	osName := strings.TrimSpace(params["os"])
	switch {
	case osName == "":
		s.appError(w, MsgOSRequired)
		return
	case !slices.ContainsFunc(v.OSes, func(o OS) bool { return o.OS == osName }):
		s.appError(w, MsgInvalidOS)
		return
	case s.busy(v):
		s.appError(w, MsgServerBusy)
		return
	}
	var script int64
	if sc := strings.TrimSpace(params["script"]); sc != "" {
		if script, err = strconv.ParseInt(sc, 10, 64); err != nil {
			s.appError(w, "Invalid init script")
			return
		}
	}
	s.reinstalls = append(s.reinstalls, ReinstallCall{ServerID: v.ID, OS: osName, SSHKey: params["ssh_key"], Script: script})
	t := s.newTask(v, TaskReinstall)
	t.os = osName
	writeJSON(w, http.StatusOK, map[string]int64{"task_id": t.id})
}

func (s *Server) reboot(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.lookup(w, r)
	if v == nil {
		return
	}
	if s.busy(v) {
		s.appError(w, MsgServerBusy)
		return
	}
	t := s.newTask(v, TaskReboot)
	writeJSON(w, http.StatusOK, map[string]int64{"task_id": t.id})
}

// busy reports whether v has an unfinished task. The caller holds s.mu.
func (s *Server) busy(v *vpsState) bool {
	if v.activeTask == 0 {
		return false
	}
	t := s.tasks[v.activeTask]
	s.advance(t, s.cfg.Clock.Now(), false)
	return t.completed.IsZero()
}

// newTask creates a task on v. The caller holds s.mu.
func (s *Server) newTask(v *vpsState, name string) *task {
	s.nextTaskID++
	t := &task{id: s.nextTaskID, serverID: v.ID, name: name, activated: s.cfg.Clock.Now()}
	if len(s.failNext) > 0 {
		t.fail, t.failMsg = true, s.failNext[0]
		s.failNext = s.failNext[1:]
	}
	s.tasks[t.id] = t
	v.activeTask = t.id
	return t
}

// advance moves t forward: a status poll counts towards TaskPolls; with
// TaskDuration, time does. The caller holds s.mu.
func (s *Server) advance(t *task, now time.Time, poll bool) {
	if !t.completed.IsZero() {
		return
	}
	if poll {
		t.polls++
	}
	var complete bool
	if d := s.cfg.TaskDuration; d > 0 {
		complete = now.Sub(t.activated) >= d
		if t.assigned.IsZero() && (poll || now.Sub(t.activated) >= d/2) {
			t.assigned = now
		}
	} else {
		complete = t.polls >= s.cfg.TaskPolls
		if t.assigned.IsZero() && t.polls >= 1 {
			t.assigned = now
		}
	}
	if complete {
		s.finish(t, now)
	}
}

// finish completes t. The caller holds s.mu.
func (s *Server) finish(t *task, now time.Time) {
	if t.assigned.IsZero() {
		t.assigned = now
	}
	t.completed = now
	v := s.servers[t.serverID]
	switch {
	case t.fail:
		// Assumed shape: the docs define no failure flag.
		t.results = "Error: " + t.failMsg
	case t.name == TaskReinstall:
		// The WHMCS module extracts "Password: (.*)" from these results.
		t.results = fmt.Sprintf("Server reinstalled with %s.\nUsername: root\nPassword: %s", t.os, randomPassword())
		if v != nil {
			v.OS = t.os
		}
	case t.name == TaskReboot:
		t.results = "VM rebooted successfully" // the docs' example
	default:
		t.results = "Task completed"
	}
	if v != nil {
		if v.activeTask == t.id {
			v.activeTask = 0
		}
		v.lastTasks = append([]int64{t.id}, v.lastTasks...)
		if len(v.lastTasks) > 5 {
			v.lastTasks = v.lastTasks[:5]
		}
	}
}

func taskJSON(t *task) map[string]string {
	return map[string]string{
		"name":      t.name,
		"activated": isoTime(t.activated),
		"assigned":  isoTime(t.assigned),
		"completed": isoTime(t.completed),
		"results":   t.results,
	}
}

// readParams reads a POST body: JSON (what the official PHP library sends)
// or a form. Values are kept as text; null and absent are "".
func readParams(r *http.Request) (map[string]string, error) {
	out := map[string]string{}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		if err := r.ParseForm(); err != nil {
			return nil, err
		}
		for k := range r.PostForm {
			out[k] = r.PostForm.Get(k)
		}
		return out, nil
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(string(b)) == "" {
		return out, nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, err
	}
	for k, v := range raw {
		var str string
		if err := json.Unmarshal(v, &str); err == nil {
			out[k] = str
			continue
		}
		if string(v) != "null" {
			out[k] = string(v)
		}
	}
	return out, nil
}

func randomPassword() string {
	var b [9]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}
