package console

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/workflows"
)

// TestEveryStatusHasItsColour: every server status and every run status
// has a badge rule (the templates write class="badge st-<status>", in the
// status's own case), and the states an operator must tell apart at a
// glance differ: unreachable is not rejected, failed is neither.
func TestEveryStatusHasItsColour(t *testing.T) {
	t.Parallel()
	css, err := os.ReadFile("static/console.css")
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]string{} // .st-<status> -> its declarations
	rule := regexp.MustCompile(`(?m)^([^{}\n]+)\{([^}]*)\}`)
	for _, m := range rule.FindAllStringSubmatch(string(css), -1) {
		for _, sel := range strings.Split(m[1], ",") {
			if sel = strings.TrimSpace(sel); strings.HasPrefix(sel, ".st-") {
				rules[strings.TrimPrefix(sel, ".st-")] = strings.TrimSpace(m[2])
			}
		}
	}
	statuses := fleet.Statuses()
	for _, s := range deployments.Statuses() {
		statuses = append(statuses, string(s))
	}
	// A workflow run's and its nodes' (workflows.go's badges).
	statuses = append(statuses, workflows.RunRunning, workflows.RunCancelling, workflows.RunSucceeded, workflows.RunFailed,
		workflows.RunCancelled, workflows.NodePending, workflows.NodeRunning, workflows.NodeWaiting, workflows.NodeSucceeded,
		workflows.NodeFailed, workflows.NodeSkipped, workflows.NodeCancelled)
	for _, s := range statuses {
		if rules[s] == "" {
			t.Errorf("status %s has no .st-%s rule: its badge has no colour", s, s)
		}
	}
	for _, pair := range [][2]string{
		{"UNREACHABLE", "FAILED"}, {"unreachable", "rejected"}, {"unreachable", "failed"},
		{"rejected", "failed"}, {"READY", "UNREACHABLE"}, {"ORPHANED", "FAILED"},
	} {
		if a, b := rules[pair[0]], rules[pair[1]]; a != "" && a == b {
			t.Errorf("%s and %s look the same (%s)", pair[0], pair[1], a)
		}
	}
}
