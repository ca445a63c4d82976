package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// templateCmd is `autoprov template`: the job templates of the API key's
// projects through the deployer's API (/api/v1/templates). A template is
// given as the JSON body of POST /api/v1/templates; `template show --json`
// prints one in a form `template update` takes back.
type templateCmd struct {
	List     templateListCmd     `cmd:"" help:"the templates of the key's projects (their current versions)"`
	Show     templateShowCmd     `cmd:"" help:"a template: its current version (or --version), what a launch may override, its survey"`
	Create   templateCreateCmd   `cmd:"" help:"create a template (the JSON body of POST /api/v1/templates, from a file or - for stdin): its version 1"`
	Update   templateUpdateCmd   `cmd:"" help:"save a template's next version from a file (what template show --json prints, edited); refused when the template changed since the file's version, unless --force"`
	Delete   templateDeleteCmd   `cmd:"" help:"delete a template with its versions, schedules and triggers (its jobs stay)"`
	Versions templateVersionsCmd `cmd:"" help:"every version of a template, newest first"`
}

// apiTemplate is what autoprov reads of a template's version.
type apiTemplate struct {
	ID               string    `json:"id"`
	ProjectID        string    `json:"project_id"`
	Name             string    `json:"name"`
	Version          int       `json:"version"`
	Latest           int       `json:"latest_version"`
	Description      string    `json:"description"`
	CreatedAt        time.Time `json:"created_at"`
	VersionCreatedAt time.Time `json:"version_created_at"`
	Job              struct {
		Source struct {
			Type       string   `json:"type"`
			Repository string   `json:"repository"`
			Ref        string   `json:"ref"`
			Paths      []string `json:"paths"`
			Collection string   `json:"collection"`
			Role       string   `json:"role"`
			RolePath   string   `json:"role_path"`
		} `json:"source"`
		Inventory struct {
			Type string `json:"type"`
		} `json:"inventory"`
	} `json:"job"`
	Ask    map[string]bool `json:"ask_on_launch"`
	Survey []struct {
		Variable string          `json:"variable"`
		Type     string          `json:"type"`
		Label    string          `json:"label"`
		Required bool            `json:"required"`
		Default  json.RawMessage `json:"default"`
		Choices  []string        `json:"choices"`
	} `json:"survey"`
}

// templatePath is the API's path of template id.
func templatePath(id string) string { return "/api/v1/templates/" + url.PathEscape(id) }

// asks lists what a launch may override.
func asks(ask map[string]bool) string {
	var list []string
	for k, v := range ask {
		if v {
			list = append(list, k)
		}
	}
	if len(list) == 0 {
		return "nothing"
	}
	slices.Sort(list)
	return strings.Join(list, ", ")
}

// source says what the template's job runs, in short.
func (tp *apiTemplate) source() string {
	s := tp.Job.Source
	var what string
	switch s.Type {
	case "collection_role":
		what = s.Collection + "." + s.Role
	case "role":
		what = s.RolePath
	default:
		what = strings.Join(s.Paths, " ")
	}
	out := s.Type + " " + what
	if s.Repository != "" {
		out += " of " + s.Repository
		if s.Ref != "" {
			out += "@" + s.Ref
		}
	}
	return out
}

// showTemplate prints a template's version.
func (g *globals) showTemplate(_ *apiClient, raw json.RawMessage) error {
	if g.json {
		return g.writeRaw(raw)
	}
	var tp apiTemplate
	if err := json.Unmarshal(raw, &tp); err != nil {
		return err
	}
	w := g.env.Stdout
	fmt.Fprintf(w, "template %s %s\n", oneLine(tp.Name), tp.ID)
	fmt.Fprintf(w, "  project: %s\n", tp.ProjectID)
	fmt.Fprintf(w, "  version: %d of %d, saved %s (template created %s)\n", tp.Version, tp.Latest, when(tp.VersionCreatedAt), when(tp.CreatedAt))
	if tp.Description != "" {
		fmt.Fprintf(w, "  description: %s\n", oneLine(tp.Description))
	}
	fmt.Fprintf(w, "  runs: %s\n", oneLine(tp.source()))
	fmt.Fprintf(w, "  inventory: %s\n", oneLine(tp.Job.Inventory.Type))
	fmt.Fprintf(w, "  a launch may set: %s\n", asks(tp.Ask))
	if len(tp.Survey) == 0 {
		fmt.Fprintln(w, "  survey: none")
		return nil
	}
	fmt.Fprintln(w, "  survey:")
	t := newTable(w, "    VARIABLE", "TYPE", "REQUIRED", "DEFAULT", "CHOICES", "LABEL")
	for _, q := range tp.Survey {
		def := "-"
		if len(q.Default) > 0 && string(q.Default) != "null" {
			def = string(q.Default)
		}
		req := "no"
		if q.Required {
			req = "yes"
		}
		t.row("    "+q.Variable, q.Type, req, def, strings.Join(q.Choices, ","), q.Label)
	}
	return t.flush()
}

type templateListCmd struct {
	Project string `name:"project" help:"only this project's templates (default: every project of the key)"`
}

func (c *templateListCmd) Run(g *globals) error {
	path := "/api/v1/templates"
	if c.Project != "" {
		path += "?project_id=" + url.QueryEscape(c.Project)
	}
	return listItems(g, path, "templates", []string{"ID", "NAME", "VERSION", "SAVED", "PROJECT", "DESCRIPTION"},
		func(_ *apiClient, tp *apiTemplate) []string {
			return []string{tp.ID, tp.Name, strconv.Itoa(tp.Latest), when(tp.VersionCreatedAt), tp.ProjectID, tp.Description}
		})
}

type templateShowCmd struct {
	ID      string `arg:"" name:"id" help:"the template's id"`
	Version int    `name:"version" help:"this version (default: the current one)"`
}

func (c *templateShowCmd) Run(g *globals) error {
	path := templatePath(c.ID)
	if c.Version > 0 {
		path += "?version=" + strconv.Itoa(c.Version)
	}
	return g.answer(http.MethodGet, path, nil, "show the template", g.showTemplate)
}

type templateCreateCmd struct {
	File string `arg:"" name:"file" help:"the template as JSON (name, job, ask_on_launch, survey; see TemplateRequest in the OpenAPI document), or - to read it from stdin"`
}

func (c *templateCreateCmd) Run(g *globals) error {
	body, err := g.readInput(c.File, "template")
	if err != nil {
		return err
	}
	return g.answer(http.MethodPost, "/api/v1/templates", body, "create the template", g.showTemplate)
}

type templateUpdateCmd struct {
	ID    string `arg:"" name:"id" help:"the template's id"`
	File  string `arg:"" name:"file" help:"the template as JSON (what template show --json prints, or the body of PUT /api/v1/templates/{id}), or - to read it from stdin"`
	Force bool   `help:"save even when the template has a newer version than the file's (the file's version is not checked)"`
}

// templateShown are the members of a shown template that are not a
// definition: update drops them (version stays: the one the change is
// made from).
var templateShown = []string{"id", "latest_version", "created_at", "version_created_at"}

func (c *templateUpdateCmd) Run(g *globals) error {
	drop := templateShown
	if c.Force {
		drop = append(slices.Clone(drop), "version")
	}
	data, err := g.readShown(c.File, "template", drop...)
	if err != nil {
		return err
	}
	return g.answer(http.MethodPut, templatePath(c.ID), data, "update the template", g.showTemplate)
}

type templateDeleteCmd struct {
	ID string `arg:"" name:"id" help:"the template's id"`
}

func (c *templateDeleteCmd) Run(g *globals) error {
	return g.deleteThing(templatePath(c.ID), "template", c.ID)
}

type templateVersionsCmd struct {
	ID string `arg:"" name:"id" help:"the template's id"`
}

func (c *templateVersionsCmd) Run(g *globals) error {
	return listItems(g, templatePath(c.ID)+"/versions", "versions", []string{"VERSION", "SAVED", "NAME", "SOURCE", "SURVEY", "LAUNCH MAY SET"},
		func(_ *apiClient, tp *apiTemplate) []string {
			return []string{strconv.Itoa(tp.Version), when(tp.VersionCreatedAt), tp.Name, tp.source(), strconv.Itoa(len(tp.Survey)), asks(tp.Ask)}
		})
}
