package messages_test

import (
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// playbookCheck is one rule of the deploy playbook's assert on a variable:
// the value must (or must not) match a regular expression from the start
// (Ansible's "match") or anywhere ("search").
type playbookCheck struct {
	negate bool
	search bool
	re     *regexp.Regexp
	line   string
}

func (c playbookCheck) accepts(v string) bool {
	loc := c.re.FindStringIndex(v)
	hit := loc != nil && (c.search || loc[0] == 0)
	return hit != c.negate
}

// deployAssert reads the rules the deploy playbook's first task asserts
// (ansible/roles/project_deploy/tasks/main.yml), per variable.
func deployAssert(t *testing.T) map[string][]playbookCheck {
	t.Helper()
	data, err := os.ReadFile("../../ansible/roles/project_deploy/tasks/main.yml")
	if err != nil {
		t.Fatal(err)
	}
	rule := regexp.MustCompile(`^\s*- (\w+) is (not )?(match|search)\('(.*)'\)\s*$`)
	each := regexp.MustCompile(`^\s*- (\w+) \| reject\('match', '(.*)'\) \| list \| length == 0\s*$`)
	out := map[string][]playbookCheck{}
	for line := range strings.SplitSeq(string(data), "\n") {
		if m := rule.FindStringSubmatch(line); m != nil {
			out[m[1]] = append(out[m[1]], playbookCheck{negate: m[2] != "", search: m[3] == "search",
				re: regexp.MustCompile(m[4]), line: strings.TrimSpace(line)})
		}
		if m := each.FindStringSubmatch(line); m != nil {
			out[m[1]+"[]"] = append(out[m[1]+"[]"], playbookCheck{re: regexp.MustCompile(m[2]), line: strings.TrimSpace(line)})
		}
	}
	for _, v := range []string{"branch", "repo", "project_id", "modules[]"} {
		if len(out[v]) == 0 {
			t.Fatalf("no assert rule for %s found in the deploy role: the test no longer reads it", v)
		}
	}
	return out
}

// TestContractWithinPlaybookAssert: every request the contract accepts
// passes the deploy playbook's own check, so that a bad branch, repository
// or module name is rejected at once instead of failing late, on the
// target. Both hand-picked and generated names are tried.
func TestContractWithinPlaybookAssert(t *testing.T) {
	rules := deployAssert(t)
	base := messages.AnsibleDeployMessage{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
		RepoFullName: "acme/shop", ServerIP: "192.0.2.1", Port: 22}
	check := func(what string, m messages.AnsibleDeployMessage) {
		t.Helper()
		data, err := messages.Encode(&m)
		if err != nil {
			t.Fatal(err)
		}
		dec, err := messages.DecodeAnsibleDeployMessage(data)
		if err != nil {
			return // rejected by the contract: fine either way
		}
		values := map[string][]string{"branch": {dec.Branch}, "repo": {dec.RepoFullName},
			"project_id": {dec.ProjectID}, "modules[]": dec.Modules}
		for v, checks := range rules {
			for _, val := range values[v] {
				for _, c := range checks {
					if !c.accepts(val) {
						t.Errorf("%s: the contract accepts %s %q, the playbook refuses it (%s)", what, v, val, c.line)
					}
				}
			}
		}
	}
	branches := []string{"main", "release/2024.05", "a.locked", "user@host", "a+b", "fonctionnalité",
		"a..b", ".b", "b.", "b/", "/b", "-b", "a//b", "b.lock", "a@{1}", "@", strings.Repeat("b", 200),
		strings.Repeat("b", 201), strings.Repeat("é", 100), "a b", "a~b", "x/.y", "x/y.lock/z", "ok_1-2.3/x"}
	rng := rand.New(rand.NewPCG(8, 8))
	const alphabet = "ab9Z._/-@{}+~:é "
	runes := []rune(alphabet)
	for range 20000 {
		n := 1 + rng.IntN(12)
		var b strings.Builder
		for range n {
			b.WriteRune(runes[rng.IntN(len(runes))])
		}
		branches = append(branches, b.String())
	}
	for _, br := range branches {
		m := base
		m.Branch = br
		check("branch", m)
	}
	for _, repo := range []string{"acme/shop", "a/.", "a/..", "a-b/c.d_e", "a/" + strings.Repeat("r", 100), "-a/b", "a/b/c"} {
		m := base
		m.RepoFullName = repo
		check("repo", m)
	}
	for _, mod := range []string{"nginx", "php-fpm", "app_1", "9lives", strings.Repeat("m", 63), strings.Repeat("m", 64), "A", "a.b"} {
		m := base
		m.Modules = []string{mod}
		check("module", m)
	}
	m := base
	m.ProjectID = "9B2F4C6E-1D3A-4E5B-8C7D-0A1B2C3D4E5F" // read as lower case
	check("project_id", m)
}
