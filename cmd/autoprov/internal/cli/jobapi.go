package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// jobCmd is `autoprov job`: Ansible jobs through the deployer's HTTP API
// (/api/v1/jobs) with an API key, as a CI pipeline runs them. The key is
// read from AUTOPROV_API_KEY (environment or env file), never from the
// command line, where other users of the machine could read it.
type jobCmd struct {
	Run    jobRunCmd    `cmd:"" help:"submit a job (the JSON body of POST /api/v1/jobs, from a file or - for stdin); --follow prints its progress and exits with its status"`
	Status jobStatusCmd `cmd:"" help:"show a job (or a deployment): status, progress, result"`
	Follow jobFollowCmd `cmd:"" help:"print a job's progress live (server-sent events, resumed after a dropped connection) and exit with its status (0 succeeded, 1 otherwise)"`
	Cancel jobCancelCmd `cmd:"" help:"cancel a job"`
	Launch jobLaunchCmd `cmd:"" help:"launch a job template (POST /api/v1/templates/{id}/launch) with survey answers; --follow prints its progress and exits with its status"`
	// Relaunch runs a finished job again.
	Relaunch jobRelaunchCmd `cmd:"" help:"run a finished job (or deployment) again with the same request; --failed only on its failed and unreachable hosts"`
}

// apiJob is what `autoprov job` reads of a job.
type apiJob struct {
	ID       string `json:"id"`
	Kind     string `json:"kind"`
	Status   string `json:"status"`
	LogURL   string `json:"log_url"`
	Progress struct {
		CurrentPlay      string `json:"current_play"`
		CurrentTask      string `json:"current_task"`
		HostsOK          int    `json:"hosts_ok"`
		HostsChanged     int    `json:"hosts_changed"`
		HostsFailed      int    `json:"hosts_failed"`
		HostsUnreachable int    `json:"hosts_unreachable"`
		HostsPending     *int   `json:"hosts_pending"`
	} `json:"progress"`
	Result *struct {
		Error *struct {
			Kind, Message string
		} `json:"error"`
	} `json:"result"`
	raw json.RawMessage
}

// job reads a job; with wait, the answer waits (up to it) for its end.
func (c *apiClient) job(ctx context.Context, id string, wait time.Duration) (*apiJob, error) {
	var raw json.RawMessage
	path := "/api/v1/jobs/" + id
	if wait > 0 {
		path += "?wait=" + wait.String()
	}
	if _, err := c.do(ctx, http.MethodGet, path, nil, nil, &raw); err != nil {
		return nil, err
	}
	j := &apiJob{raw: raw}
	return j, json.Unmarshal(raw, j)
}

// show prints j (as JSON with --json).
func (g *globals) showJob(j *apiJob) error {
	if g.json {
		return g.writeRaw(j.raw)
	}
	w := g.env.Stdout
	fmt.Fprintf(w, "%s %s: %s\n", j.Kind, j.ID, j.Status)
	p := j.Progress
	if p.CurrentPlay != "" {
		fmt.Fprintf(w, "  play %s, task %s\n", oneLine(p.CurrentPlay), oneLine(p.CurrentTask))
	}
	pending := "-"
	if p.HostsPending != nil {
		pending = itoa(int64(*p.HostsPending))
	}
	fmt.Fprintf(w, "  hosts: ok %d, changed %d, failed %d, unreachable %d, pending %s\n",
		p.HostsOK, p.HostsChanged, p.HostsFailed, p.HostsUnreachable, pending)
	if j.Result != nil && j.Result.Error != nil {
		fmt.Fprintf(w, "  error: %s: %s\n", j.Result.Error.Kind, oneLine(j.Result.Error.Message))
	}
	if j.LogURL != "" {
		fmt.Fprintf(w, "  log: %s\n", j.LogURL)
	}
	return nil
}

// exitFor is a job's exit: nil when it succeeded.
func exitFor(j *apiJob) error {
	if j.Status == "succeeded" {
		return nil
	}
	return &problemsFound{n: 1}
}

type jobRunCmd struct {
	File    string        `arg:"" name:"file" help:"the job as JSON (see POST /api/v1/jobs in the OpenAPI document), or - to read it from stdin"`
	Key     string        `name:"idempotency-key" help:"an Idempotency-Key: the same key with the same body is the same job (safe retries)"`
	Follow  bool          `help:"print the job's progress live and exit with its status (0 succeeded, 1 otherwise)"`
	Timeout time.Duration `default:"1h" help:"with --follow: give up waiting after this long"`
}

func (c *jobRunCmd) Run(g *globals) error {
	body, err := g.readInput(c.File, "job")
	if err != nil {
		return err
	}
	api, err := g.api()
	if err != nil {
		return err
	}
	return submit(g, api, "/api/v1/jobs", body, c.Key, c.Follow, c.Timeout)
}

// submit POSTs body to path (a job's submit, a template's launch, a
// relaunch) with the Idempotency-Key idem, and shows the job it answers
// with, or follows it.
func submit(g *globals, api *apiClient, path string, body []byte, idem string, follow bool, timeout time.Duration) error {
	hdr := map[string]string{}
	if idem != "" {
		hdr["Idempotency-Key"] = idem
	}
	var raw json.RawMessage
	if _, err := api.do(g.ctx, http.MethodPost, path, body, hdr, &raw); err != nil {
		return fmt.Errorf("POST %s: %w", path, err)
	}
	j := &apiJob{raw: raw}
	if err := json.Unmarshal(raw, j); err != nil {
		return err
	}
	if !follow {
		return g.showJob(j)
	}
	if !g.json {
		fmt.Fprintf(g.env.Stdout, "job %s queued\n", j.ID)
	}
	return followJob(g, api, j.ID, timeout)
}

// launchFlags are what a template is launched with: survey answers typed
// by its survey, and the rest of the launch from a file. job launch, and
// what a schedule's occurrences and a trigger's deliveries launch with.
type launchFlags struct {
	Set  map[string]string `name:"set" mapsep:"none" help:"a survey answer, variable=value, typed by the survey (an integer question's value is a number, a multi_choice's a comma-separated list); repeatable"`
	Body string            `name:"body" help:"a JSON file with the rest of the launch (limit, tags, extra_vars, ref, version, ...; see Launch in the OpenAPI document)"`
}

// read builds the launch of template: --body's object with the --set
// answers in its survey, typed by the template's survey; survey is that
// map (added to the launch when not empty).
func (f *launchFlags) read(g *globals, api *apiClient, template string) (launch, survey map[string]any, err error) {
	launch = map[string]any{}
	if f.Body != "" {
		data, err := os.ReadFile(f.Body)
		if err != nil {
			return nil, nil, usageError{fmt.Errorf("read the launch: %w", err)}
		}
		if err := json.Unmarshal(data, &launch); err != nil || launch == nil {
			return nil, nil, usageError{errors.New("the launch is not a JSON object")}
		}
	}
	survey, _ = launch["survey"].(map[string]any)
	if survey == nil {
		survey = map[string]any{}
	}
	if len(f.Set) > 0 {
		// Answers are typed by the template's survey: an integer
		// question's is a number, a multi_choice's a comma-separated list.
		var tpl struct {
			Survey []struct{ Variable, Type string } `json:"survey"`
		}
		if _, err := api.call(g.ctx, http.MethodGet, "/api/v1/templates/"+url.PathEscape(template), nil, &tpl); err != nil {
			return nil, nil, fmt.Errorf("read the template: %w", err)
		}
		types := map[string]string{}
		for _, q := range tpl.Survey {
			types[q.Variable] = q.Type
		}
		for name, v := range f.Set {
			switch types[name] {
			case "integer":
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return nil, nil, usageError{fmt.Errorf("--set %s: the question asks for a whole number", name)}
				}
				survey[name] = n
			case "multi_choice":
				list := []string{}
				for item := range strings.SplitSeq(v, ",") {
					if item = strings.TrimSpace(item); item != "" {
						list = append(list, item)
					}
				}
				survey[name] = list
			case "secret":
				return nil, nil, usageError{fmt.Errorf("--set %s: a secret question's answer never comes from the command line (job launch: --secret-from-env)", name)}
			default:
				survey[name] = v // the API refuses an answer to no question
			}
		}
	}
	if len(survey) > 0 {
		launch["survey"] = survey
	}
	return launch, survey, nil
}

// create makes what launches template (a schedule, a trigger: below is
// its collection under the template's path): req with the launch the
// flags give, shown with show.
func (f *launchFlags) create(g *globals, template, below string, req map[string]any, show func(*apiClient, json.RawMessage) error) error {
	api, err := g.api()
	if err != nil {
		return err
	}
	if req["launch"], _, err = f.read(g, api, template); err != nil {
		return err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	raw, err := api.call(g.ctx, http.MethodPost, templatePath(template)+"/"+below, body, nil)
	if err != nil {
		return fmt.Errorf("create the %s: %w", strings.TrimSuffix(below, "s"), err)
	}
	return show(api, raw)
}

type jobLaunchCmd struct {
	Template    string `arg:"" name:"template" help:"the template's id"`
	launchFlags `embed:""`
	Secret      map[string]string `name:"secret-from-env" help:"a secret question's answer, variable=ENV_NAME: read from that environment variable, never from the command line; repeatable"`
	Key         string            `name:"idempotency-key" help:"an Idempotency-Key: the same key with the same launch is the same job (safe retries)"`
	Follow      bool              `help:"print the job's progress live and exit with its status (0 succeeded, 1 otherwise)"`
	Timeout     time.Duration     `default:"1h" help:"with --follow: give up waiting after this long"`
}

func (c *jobLaunchCmd) Run(g *globals) error {
	api, err := g.api()
	if err != nil {
		return err
	}
	launch, survey, err := c.read(g, api, c.Template)
	if err != nil {
		return err
	}
	for name, env := range c.Secret {
		v := g.getenv(env)
		if v == "" {
			return usageError{fmt.Errorf("--secret-from-env %s: the environment variable %s is not set", name, env)}
		}
		survey[name] = v
	}
	if len(survey) > 0 {
		launch["survey"] = survey
	}
	body, err := json.Marshal(launch)
	if err != nil {
		return err
	}
	return submit(g, api, "/api/v1/templates/"+url.PathEscape(c.Template)+"/launch", body, c.Key, c.Follow, c.Timeout)
}

type jobRelaunchCmd struct {
	ID      string        `arg:"" name:"id" help:"the finished job's (or deployment's) id"`
	Failed  bool          `help:"only on the hosts that failed or were unreachable"`
	Key     string        `name:"idempotency-key" help:"an Idempotency-Key (safe retries)"`
	Follow  bool          `help:"print the job's progress live and exit with its status (0 succeeded, 1 otherwise)"`
	Timeout time.Duration `default:"1h" help:"with --follow: give up waiting after this long"`
}

func (c *jobRelaunchCmd) Run(g *globals) error {
	api, err := g.api()
	if err != nil {
		return err
	}
	body := []byte(`{"hosts":"all"}`)
	if c.Failed {
		body = []byte(`{"hosts":"failed"}`)
	}
	return submit(g, api, "/api/v1/jobs/"+c.ID+"/relaunch", body, c.Key, c.Follow, c.Timeout)
}

type jobStatusCmd struct {
	ID string `arg:"" name:"id" help:"the job's (or a deployment's) id"`
}

func (c *jobStatusCmd) Run(g *globals) error {
	api, err := g.api()
	if err != nil {
		return err
	}
	j, err := api.job(g.ctx, c.ID, 0)
	if err != nil {
		return err
	}
	return g.showJob(j)
}

type jobFollowCmd struct {
	ID      string        `arg:"" name:"id" help:"the job's (or a deployment's) id"`
	Timeout time.Duration `default:"1h" help:"give up waiting after this long"`
}

func (c *jobFollowCmd) Run(g *globals) error {
	api, err := g.api()
	if err != nil {
		return err
	}
	return followJob(g, api, c.ID, c.Timeout)
}

type jobCancelCmd struct {
	ID string `arg:"" name:"id" help:"the job's (or a deployment's) id"`
}

func (c *jobCancelCmd) Run(g *globals) error {
	api, err := g.api()
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if _, err := api.do(g.ctx, http.MethodDelete, "/api/v1/jobs/"+c.ID, nil, nil, &raw); err != nil {
		return fmt.Errorf("cancel: %w", err)
	}
	j := &apiJob{raw: raw}
	if err := json.Unmarshal(raw, j); err != nil {
		return err
	}
	return g.showJob(j)
}

// followJob prints the job's events from its stream, reconnecting with
// Last-Event-ID when the connection drops, then shows the job and exits
// with its status.
func followJob(g *globals, api *apiClient, id string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(g.ctx, timeout)
	defer cancel()
	last := ""
	for attempt := 0; ; attempt++ {
		done, err := streamJob(ctx, g, api, id, &last)
		if done {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("follow %s: gave up after %s", id, timeout)
		}
		var ae *apiError
		if errors.As(err, &ae) && ae.Status < 500 && ae.Status != http.StatusTooManyRequests {
			return fmt.Errorf("follow %s: %w", id, err)
		}
		select { // the server restarted, or the connection dropped
		case <-ctx.Done():
		case <-time.After(time.Duration(min(attempt+1, 5)) * time.Second):
		}
	}
	// The stream's end comes a moment before the result is recorded: the
	// answer waits for the job's final state.
	j, err := api.job(g.ctx, id, time.Minute)
	if err != nil {
		return err
	}
	if err := g.showJob(j); err != nil {
		return err
	}
	return exitFor(j)
}

// streamJob reads the job's event stream after *last and reports whether
// it reached the end.
func streamJob(ctx context.Context, g *globals, api *apiClient, id string, last *string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, api.base+"/api/v1/jobs/"+id+"/stream", nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Authorization", "Bearer "+api.key)
	req.Header.Set("Accept", "text/event-stream")
	if *last != "" {
		req.Header.Set("Last-Event-ID", *last)
	}
	resp, err := api.http.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNoContent:
		return true, nil // the end was seen already
	case resp.StatusCode != http.StatusOK:
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return false, &apiError{Status: resp.StatusCode, Body: data}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var evID, evType, data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "id: "):
			evID = line[4:]
		case strings.HasPrefix(line, "event: "):
			evType = line[7:]
		case strings.HasPrefix(line, "data: "):
			data = line[6:]
		case line == "" && evType != "":
			var ev struct {
				Type, Play, Task, Host, Message, Status string
			}
			if json.Unmarshal([]byte(data), &ev) == nil {
				showEvent(g, &messages.ProgressEvent{Type: messages.EventType(ev.Type), Play: ev.Play, Task: ev.Task,
					Host: ev.Host, Message: ev.Message, Status: messages.Status(ev.Status)})
			}
			if evID != "" {
				*last = evID
			}
			if evType == string(messages.EventRunFinished) {
				return true, nil
			}
			evID, evType, data = "", "", ""
		}
	}
	return false, sc.Err()
}
