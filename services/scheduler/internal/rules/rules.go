// Package rules holds the scheduler's rules file: YAML rules that map
// servers, by their groups and labels, to extra playbooks and settings
// (seed 001's matcher). Rules are validated when loaded, with errors that
// name the file, the line and the rule; a Holder reloads them on SIGHUP or
// when the file changes and keeps the old rules when a reload fails.
//
// The file:
//
//	defaults:
//	  retry_limit: 3
//	rules:
//	  - name: web servers
//	    match:
//	      all:                     # every condition holds
//	        - group: web           # inventory group (label "group:web")
//	        - label: env           # label equality
//	          equals: prod
//	      any:                     # at least one condition holds
//	        - label: monitoring    # label existence
//	        - group: edge
//	    playbooks: [nginx.yml]     # run after setup_server.yml, in file order
//	    settings:
//	      retry_limit: 5
//	      health_url: "http://{address}:8080/healthz"
//
// A rule without match matches every server. Several rules may match one
// server: their playbooks run in the order the file lists them (each once),
// and for each setting the last matching rule that sets it wins.
package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// GroupLabel returns the label key of an inventory group: "group:<name>".
func GroupLabel(group string) string { return "group:" + group }

// Condition is one test of a server's groups or labels.
type Condition struct {
	// Group is an inventory group the server must be in; or
	Group string
	// Label is a label the server must have, with the value Equals when
	// HasEquals (else any value).
	Label     string
	Equals    string
	HasEquals bool
}

func (c Condition) holds(labels map[string]string) bool {
	if c.Group != "" {
		_, ok := labels[GroupLabel(c.Group)]
		return ok
	}
	v, ok := labels[c.Label]
	return ok && (!c.HasEquals || v == c.Equals)
}

// Settings are per-server settings a rule may set; zero values are unset.
type Settings struct {
	// RetryLimit is how many failed attempts the server may have.
	RetryLimit int
	// HealthURL is probed (GET, 2xx) besides the SSH port; {address} and
	// {handle} are replaced.
	HealthURL string
}

// Rule is one rule of the file.
type Rule struct {
	Name      string
	Line      int
	All       []Condition
	Any       []Condition
	Playbooks []string
	Settings  Settings
}

// Matches reports whether the rule applies to a server with labels.
func (r *Rule) Matches(labels map[string]string) bool {
	for _, c := range r.All {
		if !c.holds(labels) {
			return false
		}
	}
	if len(r.Any) == 0 {
		return true
	}
	for _, c := range r.Any {
		if c.holds(labels) {
			return true
		}
	}
	return false
}

// Set is a validated rules file.
type Set struct {
	// File is where the rules came from ("" for the empty set).
	File     string
	Defaults Settings
	Rules    []Rule
}

// Plan is what the rules say of one server.
type Plan struct {
	// Playbooks to run after setup_server.yml, in order.
	Playbooks []string
	// Rules that matched, in file order.
	Rules    []string
	Settings Settings
}

// Plan returns the playbooks and settings for a server with labels. A nil
// Set gives an empty plan.
func (s *Set) Plan(labels map[string]string) Plan {
	var p Plan
	if s == nil {
		return p
	}
	p.Settings = s.Defaults
	for i := range s.Rules {
		r := &s.Rules[i]
		if !r.Matches(labels) {
			continue
		}
		p.Rules = append(p.Rules, r.Name)
		for _, pb := range r.Playbooks {
			if !slices.Contains(p.Playbooks, pb) {
				p.Playbooks = append(p.Playbooks, pb)
			}
		}
		if r.Settings.RetryLimit != 0 {
			p.Settings.RetryLimit = r.Settings.RetryLimit
		}
		if r.Settings.HealthURL != "" {
			p.Settings.HealthURL = r.Settings.HealthURL
		}
	}
	return p
}

// Problem is one error of a rules file, with where it is.
type Problem struct {
	File string
	Line int
	Rule string // "" outside a rule
	Msg  string
}

func (p Problem) String() string {
	var b strings.Builder
	b.WriteString(p.File)
	if p.Line > 0 {
		b.WriteString(":" + strconv.Itoa(p.Line))
	}
	if p.Rule != "" {
		b.WriteString(": rule " + strconv.Quote(p.Rule))
	}
	b.WriteString(": " + p.Msg)
	return b.String()
}

// Error lists every problem of a rules file.
type Error struct{ Problems []Problem }

func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return "invalid rules file:\n  " + strings.Join(lines, "\n  ")
}

// Reserved playbooks are run by infra itself and cannot be extra playbooks.
var Reserved = []string{"setup_server.yml", "recovery.yml", "nuke.yml", "deploy_project.yml"}

// PlaybookNamePattern is the shape of an extra playbook's name: a file in
// the playbooks directory, no path.
const PlaybookNamePattern = `^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\.ya?ml$`

var playbookRE = regexp.MustCompile(PlaybookNamePattern)

// MaxRetryLimit bounds retry_limit.
const MaxRetryLimit = 100

// Load reads and validates the rules file path. playbookDir is the
// directory holding the playbooks (ansible/playbooks): every playbook a
// rule names must exist there. An empty path gives an empty Set.
func Load(path, playbookDir string) (*Set, error) {
	if path == "" {
		return &Set{}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read rules file: %w", err)
	}
	return Parse(path, data, playbookDir)
}

// Parse validates the rules file data (named file in errors).
func Parse(file string, data []byte, playbookDir string) (*Set, error) {
	p := &parser{file: file, playbookDir: playbookDir}
	set := p.parse(data)
	if len(p.problems) > 0 {
		return nil, &Error{Problems: p.problems}
	}
	set.File = file
	return set, nil
}

type parser struct {
	file        string
	playbookDir string
	problems    []Problem
	rule        string
}

func (p *parser) add(n *yaml.Node, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	p.problems = append(p.problems, Problem{File: p.file, Line: line, Rule: p.rule, Msg: fmt.Sprintf(format, args...)})
}

// fields checks that n is a mapping with only the allowed keys and returns
// its values by key.
func (p *parser) fields(n *yaml.Node, what string, allowed ...string) map[string]*yaml.Node {
	if n.Kind != yaml.MappingNode {
		p.add(n, "%s must be a mapping", what)
		return nil
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !slices.Contains(allowed, k.Value) {
			p.add(k, "unknown key %q in %s (allowed: %s)", k.Value, what, strings.Join(allowed, ", "))
			continue
		}
		if out[k.Value] != nil {
			p.add(k, "key %q given twice in %s", k.Value, what)
		}
		out[k.Value] = v
	}
	return out
}

func (p *parser) str(n *yaml.Node, what string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.add(n, "%s must be a string", what)
		return "", false
	}
	return n.Value, true
}

func (p *parser) parse(data []byte) *Set {
	set := &Set{}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return set // an empty file: no rules
		}
		p.problems = append(p.problems, Problem{File: p.file, Line: yamlErrorLine(err), Msg: "not valid YAML: " + err.Error()})
		return set
	}
	if len(doc.Content) == 0 {
		return set
	}
	root := doc.Content[0]
	top := p.fields(root, "the rules file", "defaults", "rules")
	if top == nil {
		return set
	}
	if d := top["defaults"]; d != nil {
		set.Defaults = p.settings(d, "defaults")
	}
	r := top["rules"]
	if r == nil {
		return set
	}
	if r.Kind != yaml.SequenceNode {
		p.add(r, "rules must be a list")
		return set
	}
	names := map[string]int{}
	for i, rn := range r.Content {
		rule := p.rule1(rn, i)
		if rule == nil {
			continue
		}
		if first, dup := names[rule.Name]; dup {
			p.rule = rule.Name
			p.add(rn, "name %q already used by the rule at line %d", rule.Name, first)
			p.rule = ""
		} else {
			names[rule.Name] = rule.Line
		}
		set.Rules = append(set.Rules, *rule)
	}
	return set
}

func (p *parser) rule1(n *yaml.Node, i int) *Rule {
	p.rule = fmt.Sprintf("#%d", i+1)
	defer func() { p.rule = "" }()
	if n.Kind == yaml.MappingNode { // name the rule in every problem, also those found before its name
		for j := 0; j+1 < len(n.Content); j += 2 {
			if n.Content[j].Value == "name" && n.Content[j+1].Kind == yaml.ScalarNode && n.Content[j+1].Value != "" {
				p.rule = n.Content[j+1].Value
			}
		}
	}
	before := len(p.problems)
	f := p.fields(n, fmt.Sprintf("rule #%d", i+1), "name", "match", "playbooks", "settings")
	if f == nil {
		return nil
	}
	r := &Rule{Line: n.Line}
	if nn := f["name"]; nn == nil {
		p.add(n, "name is required")
	} else if name, ok := p.str(nn, "name"); ok {
		if strings.TrimSpace(name) == "" {
			p.add(nn, "name must not be empty")
		}
		r.Name = name
	}
	if m := f["match"]; m != nil {
		mf := p.fields(m, "match", "all", "any")
		r.All = p.conditions(mf["all"], "match.all")
		r.Any = p.conditions(mf["any"], "match.any")
	}
	if pbs := f["playbooks"]; pbs != nil {
		if pbs.Kind != yaml.SequenceNode {
			p.add(pbs, "playbooks must be a list of playbook file names")
		} else {
			for _, pn := range pbs.Content {
				if name, ok := p.str(pn, "a playbook"); ok && p.playbook(pn, name) {
					if slices.Contains(r.Playbooks, name) {
						p.add(pn, "playbook %q listed twice", name)
						continue
					}
					r.Playbooks = append(r.Playbooks, name)
				}
			}
		}
	}
	if s := f["settings"]; s != nil {
		r.Settings = p.settings(s, "settings")
	}
	if len(p.problems) == before && len(r.Playbooks) == 0 && r.Settings == (Settings{}) {
		p.add(n, "the rule has neither playbooks nor settings: it would do nothing")
	}
	return r
}

// playbook checks an extra playbook's name and that it exists.
func (p *parser) playbook(n *yaml.Node, name string) bool {
	switch {
	case !playbookRE.MatchString(name):
		p.add(n, "playbook %q must be a file name in the playbooks directory (%s)", name, PlaybookNamePattern)
		return false
	case slices.Contains(Reserved, name):
		p.add(n, "playbook %q is run by infra itself and cannot be an extra playbook", name)
		return false
	}
	if p.playbookDir == "" {
		return true
	}
	st, err := os.Stat(filepath.Join(p.playbookDir, name))
	if err != nil || !st.Mode().IsRegular() {
		p.add(n, "playbook %q does not exist in %s", name, p.playbookDir)
		return false
	}
	return true
}

func (p *parser) conditions(n *yaml.Node, what string) []Condition {
	if n == nil {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.add(n, "%s must be a list of conditions", what)
		return nil
	}
	var out []Condition
	for _, cn := range n.Content {
		f := p.fields(cn, "a condition of "+what, "group", "label", "equals")
		if f == nil {
			continue
		}
		var c Condition
		switch {
		case f["group"] != nil && f["label"] != nil:
			p.add(cn, "a condition has either group or label, not both")
			continue
		case f["group"] != nil:
			c.Group, _ = p.str(f["group"], "group")
			if f["equals"] != nil {
				p.add(f["equals"], "equals goes with label, not group")
			}
		case f["label"] != nil:
			c.Label, _ = p.str(f["label"], "label")
			if e := f["equals"]; e != nil {
				c.Equals, c.HasEquals = p.str(e, "equals")
			}
		default:
			p.add(cn, "a condition needs group or label")
			continue
		}
		if c.Group == "" && c.Label == "" {
			p.add(cn, "empty group or label")
			continue
		}
		out = append(out, c)
	}
	return out
}

func (p *parser) settings(n *yaml.Node, what string) Settings {
	var s Settings
	f := p.fields(n, what, "retry_limit", "health_url")
	if rl := f["retry_limit"]; rl != nil {
		v, err := strconv.Atoi(rl.Value)
		if rl.Kind != yaml.ScalarNode || err != nil || v < 1 || v > MaxRetryLimit {
			p.add(rl, "retry_limit must be an integer from 1 to %d", MaxRetryLimit)
		} else {
			s.RetryLimit = v
		}
	}
	if hu := f["health_url"]; hu != nil {
		if v, ok := p.str(hu, "health_url"); ok {
			u, err := url.Parse(strings.NewReplacer("{address}", "h", "{handle}", "h").Replace(v))
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				p.add(hu, "health_url must be an http(s) URL such as http://{address}:8080/healthz")
			} else {
				s.HealthURL = v
			}
		}
	}
	return s
}

var lineRE = regexp.MustCompile(`line (\d+)`)

// yamlErrorLine digs the line out of a yaml syntax error (0 when absent).
func yamlErrorLine(err error) int {
	m := lineRE.FindStringSubmatch(err.Error())
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
