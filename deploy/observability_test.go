package deploy

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// exportedMetrics lists the metric names the code registers: every
// prometheus.{Counter,Gauge,Histogram,Summary}Opts literal in the
// non-test Go files of pkg/ and services/, its Namespace, Subsystem and Name
// joined as client_golang joins them (string constants resolved within the
// file).
func exportedMetrics(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, dir := range []string{"pkg", "services"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, p, nil, 0)
			if err != nil {
				return err
			}
			consts := map[string]string{}
			ast.Inspect(f, func(n ast.Node) bool {
				if vs, ok := n.(*ast.ValueSpec); ok {
					for i, name := range vs.Names {
						if i < len(vs.Values) {
							if s, ok := stringLit(vs.Values[i]); ok {
								consts[name.Name] = s
							}
						}
					}
				}
				return true
			})
			ast.Inspect(f, func(n ast.Node) bool {
				cl, ok := n.(*ast.CompositeLit)
				if !ok {
					return true
				}
				sel, ok := cl.Type.(*ast.SelectorExpr)
				if !ok || !strings.HasSuffix(sel.Sel.Name, "Opts") || !isIdent(sel.X, "prometheus") {
					return true
				}
				parts := map[string]string{}
				for _, e := range cl.Elts {
					kv, ok := e.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					key, _ := kv.Key.(*ast.Ident)
					if key == nil {
						continue
					}
					if s, ok := stringLit(kv.Value); ok {
						parts[key.Name] = s
					} else if id, ok := kv.Value.(*ast.Ident); ok {
						parts[key.Name] = consts[id.Name]
					}
				}
				if parts["Name"] == "" {
					return true
				}
				var name []string
				for _, k := range []string{"Namespace", "Subsystem", "Name"} {
					if parts[k] != "" {
						name = append(name, parts[k])
					}
				}
				out[strings.Join(name, "_")] = sel.Sel.Name
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// The scan must see the metrics we know exist.
	for _, known := range []string{"autoprov_stream_group_lag", "autoprov_infra_jobs_total", "autoprov_ssh_attempts_total"} {
		if out[known] == "" {
			t.Fatalf("the scan of the code missed %s: it is broken (found %v)", known, out)
		}
	}
	return out
}

func stringLit(e ast.Expr) (string, bool) {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(bl.Value)
	return s, err == nil
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

var metricRef = regexp.MustCompile(`\bautoprov_[a-z0-9_]+\b`)

// checkMetricNames fails for every autoprov_ metric an expression uses that
// no service exports (histogram series by their _bucket, _sum, _count).
func checkMetricNames(t *testing.T, where, expr string, exported map[string]string) {
	t.Helper()
	for _, name := range metricRef.FindAllString(expr, -1) {
		if exported[name] != "" {
			continue
		}
		base := name
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			base = strings.TrimSuffix(base, suf)
		}
		if kind := exported[base]; kind == "HistogramOpts" || kind == "SummaryOpts" {
			continue
		}
		t.Errorf("%s uses %s, which no service exports", where, name)
	}
}

func TestAlertRules(t *testing.T) {
	exported := exportedMetrics(t)
	data, err := os.ReadFile(filepath.Join("observability", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatal(err)
	}
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			checkMetricNames(t, "alert "+r.Alert, r.Expr, exported)
		}
	}
	// What should page someone: lag growing, dead letters, every run
	// failing, a service down.
	for _, want := range []string{"AutoprovServiceDown", "AutoprovQueueLagGrowing", "AutoprovDeadLetters", "AutoprovEveryRunFailing"} {
		if !alerts[want] {
			t.Errorf("no alert %s", want)
		}
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install Debian's prometheus package (scripts/services.sh deps does)")
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "observability"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

func TestGrafanaDashboard(t *testing.T) {
	exported := exportedMetrics(t)
	data, err := os.ReadFile(filepath.Join("observability", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	if dash.UID == "" || dash.Title == "" || len(dash.Panels) < 6 {
		t.Fatalf("dashboard uid %q title %q, %d panels", dash.UID, dash.Title, len(dash.Panels))
	}
	used := map[string]bool{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			checkMetricNames(t, "panel "+p.Title, tg.Expr, exported)
			for _, n := range metricRef.FindAllString(tg.Expr, -1) {
				used[n] = true
			}
		}
	}
	for _, want := range []string{"autoprov_stream_group_lag", "autoprov_stream_group_pending", "autoprov_infra_runs_in_flight", "autoprov_infra_job_duration_seconds_bucket", "autoprov_ssh_attempts_total", "autoprov_infra_servers_marked_unreachable_total", "autoprov_stream_dead_lettered_total"} {
		if !used[want] {
			t.Errorf("the dashboard does not show %s", want)
		}
	}
}
