package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// triggerCmd is `autoprov trigger`: a template's webhook URL that git
// hosting calls on a push, verified by a secret
// (/api/v1/templates/{id}/triggers, /api/v1/triggers/{id}).
type triggerCmd struct {
	List   triggerListCmd   `cmd:"" help:"a template's triggers, with their hook URLs"`
	Show   triggerShowCmd   `cmd:"" help:"a trigger and its recent deliveries with what came of them"`
	Create triggerCreateCmd `cmd:"" help:"a webhook URL for git hosting to launch the template on a push (the template must ask for the ref; the key needs templates:launch too): prints the URL and the secret, shown only now"`
	Rotate triggerRotateCmd `cmd:"" help:"give a trigger a new secret (printed, shown only now); the old one stops verifying at once"`
	Delete triggerDeleteCmd `cmd:"" help:"delete a trigger (its jobs stay)"`
}

// apiTrigger is what autoprov reads of a trigger.
type apiTrigger struct {
	ID         string    `json:"id"`
	TemplateID string    `json:"template_id"`
	Name       string    `json:"name"`
	Provider   string    `json:"provider"`
	Branches   []string  `json:"branches"`
	Tags       []string  `json:"tags"`
	URL        string    `json:"url"`
	Secret     string    `json:"secret"`
	CreatedAt  time.Time `json:"created_at"`
	Recent     []struct {
		Delivery   string    `json:"delivery"`
		Event      string    `json:"event"`
		Ref        string    `json:"ref"`
		Commit     string    `json:"commit"`
		Outcome    string    `json:"outcome"`
		JobID      string    `json:"job_id"`
		Reason     string    `json:"reason"`
		ReceivedAt time.Time `json:"received_at"`
	} `json:"recent"`
}

// triggerPath is the API's path of trigger id.
func triggerPath(id string) string { return "/api/v1/triggers/" + url.PathEscape(id) }

// filters says which pushes launch.
func (tr *apiTrigger) filters() string {
	if len(tr.Branches) == 0 && len(tr.Tags) == 0 {
		return "any branch, no tag"
	}
	var parts []string
	if len(tr.Branches) > 0 {
		parts = append(parts, "branches "+strings.Join(tr.Branches, ","))
	}
	if len(tr.Tags) > 0 {
		parts = append(parts, "tags "+strings.Join(tr.Tags, ","))
	}
	return strings.Join(parts, "; ")
}

// secretField is where the provider's webhook settings take the secret.
var secretField = map[string]string{"github": "Secret", "gitea": "Secret", "gitlab": "Secret token"}

// showTrigger prints a trigger: its hook URL (below the API's address
// autoprov uses) and, answering create and rotate, its secret.
func (g *globals) showTrigger(api *apiClient, raw json.RawMessage) error {
	if g.json {
		return g.writeRaw(raw)
	}
	var tr apiTrigger
	if err := json.Unmarshal(raw, &tr); err != nil {
		return err
	}
	w := g.env.Stdout
	fmt.Fprintf(w, "trigger %s %s: %s\n", oneLine(tr.Name), tr.ID, oneLine(tr.Provider))
	fmt.Fprintf(w, "  template: %s\n", tr.TemplateID)
	fmt.Fprintf(w, "  launches on a push of: %s\n", oneLine(tr.filters()))
	fmt.Fprintf(w, "  url: %s\n", oneLine(api.base+tr.URL))
	if tr.Secret != "" {
		fmt.Fprintf(w, "  secret: %s\n", oneLine(tr.Secret))
		fmt.Fprintf(w, "  give git hosting the url and, as the webhook's %s, the secret: it is shown only now (trigger rotate makes a new one)\n",
			secretField[tr.Provider])
	}
	if len(tr.Recent) == 0 {
		return nil
	}
	fmt.Fprintln(w, "  recent:")
	t := newTable(w, "    RECEIVED", "EVENT", "REF", "COMMIT", "OUTCOME", "JOB", "REASON")
	for _, d := range tr.Recent {
		commit := d.Commit
		if len(commit) > 12 {
			commit = commit[:12]
		}
		t.row("    "+when(d.ReceivedAt), d.Event, d.Ref, commit, d.Outcome, d.JobID, d.Reason)
	}
	return t.flush()
}

type triggerListCmd struct {
	Template string `arg:"" name:"template" help:"the template's id"`
}

func (c *triggerListCmd) Run(g *globals) error {
	return listItems(g, templatePath(c.Template)+"/triggers", "triggers", []string{"ID", "NAME", "PROVIDER", "LAUNCHES ON", "URL"},
		func(api *apiClient, tr *apiTrigger) []string {
			return []string{tr.ID, tr.Name, tr.Provider, tr.filters(), api.base + tr.URL}
		})
}

type triggerShowCmd struct {
	ID string `arg:"" name:"id" help:"the trigger's id"`
}

func (c *triggerShowCmd) Run(g *globals) error {
	return g.answer(http.MethodGet, triggerPath(c.ID), nil, "show the trigger", g.showTrigger)
}

type triggerCreateCmd struct {
	Template    string   `arg:"" name:"template" help:"the template's id"`
	Name        string   `name:"name" required:"" help:"the trigger's name (unique in the project)"`
	Provider    string   `name:"provider" required:"" help:"who calls it, and so how it is signed: github (X-Hub-Signature-256), gitlab (X-Gitlab-Token) or gitea (X-Gitea-Signature)"`
	Branches    []string `name:"branch" help:"a glob pattern of the branches whose pushes launch; repeatable (no --branch nor --tag: any branch)"`
	Tags        []string `name:"tag" help:"a glob pattern of the tags whose pushes launch; repeatable"`
	launchFlags `embed:""`
}

func (c *triggerCreateCmd) Run(g *globals) error {
	req := map[string]any{"name": c.Name, "provider": c.Provider, "branches": c.Branches, "tags": c.Tags}
	return c.create(g, c.Template, "triggers", req, g.showTrigger)
}

type triggerRotateCmd struct {
	ID string `arg:"" name:"id" help:"the trigger's id"`
}

func (c *triggerRotateCmd) Run(g *globals) error {
	return g.answer(http.MethodPost, triggerPath(c.ID)+"/rotate", nil, "rotate the trigger's secret", g.showTrigger)
}

type triggerDeleteCmd struct {
	ID string `arg:"" name:"id" help:"the trigger's id"`
}

func (c *triggerDeleteCmd) Run(g *globals) error {
	return g.deleteThing(triggerPath(c.ID), "trigger", c.ID)
}
