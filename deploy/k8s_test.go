package deploy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// Minimal shapes of the rendered objects: what the checks read.
type (
	object struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name      string            `json:"name"`
			Namespace string            `json:"namespace"`
			Labels    map[string]string `json:"labels"`
		} `json:"metadata"`
		Data map[string]string `json:"data"`
		raw  map[string]any
	}
	deployment struct {
		Spec struct {
			Replicas *int     `json:"replicas"`
			Selector selector `json:"selector"`
			Template struct {
				Metadata struct {
					Labels map[string]string `json:"labels"`
				} `json:"metadata"`
				Spec podSpec `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	podSpec struct {
		TerminationGracePeriodSeconds *int64      `json:"terminationGracePeriodSeconds"`
		Containers                    []container `json:"containers"`
	}
	container struct {
		Name  string `json:"name"`
		Ports []struct {
			Name          string `json:"name"`
			ContainerPort int    `json:"containerPort"`
		} `json:"ports"`
		Env []struct {
			Name      string `json:"name"`
			Value     string `json:"value"`
			ValueFrom *struct {
				SecretKeyRef *struct {
					Name string `json:"name"`
					Key  string `json:"key"`
				} `json:"secretKeyRef"`
			} `json:"valueFrom"`
		} `json:"env"`
		EnvFrom []struct {
			ConfigMapRef *struct {
				Name string `json:"name"`
			} `json:"configMapRef"`
		} `json:"envFrom"`
		StartupProbe, LivenessProbe, ReadinessProbe *probe
		Resources                                   struct {
			Requests map[string]string `json:"requests"`
			Limits   map[string]string `json:"limits"`
		} `json:"resources"`
		SecurityContext struct {
			RunAsNonRoot             *bool `json:"runAsNonRoot"`
			AllowPrivilegeEscalation *bool `json:"allowPrivilegeEscalation"`
		} `json:"securityContext"`
	}
	probe struct {
		HTTPGet *struct {
			Path string `json:"path"`
			Port any    `json:"port"`
		} `json:"httpGet"`
	}
	selector struct {
		MatchLabels      map[string]string `json:"matchLabels"`
		MatchExpressions []struct {
			Key      string   `json:"key"`
			Operator string   `json:"operator"`
			Values   []string `json:"values"`
		} `json:"matchExpressions"`
	}
	networkPolicy struct {
		Spec struct {
			PodSelector selector `json:"podSelector"`
			PolicyTypes []string `json:"policyTypes"`
			Ingress     []struct {
				From  []map[string]any `json:"from"`
				Ports []policyPort     `json:"ports"`
			} `json:"ingress"`
			Egress []struct {
				To    []map[string]any `json:"to"`
				Ports []policyPort     `json:"ports"`
			} `json:"egress"`
		} `json:"spec"`
	}
	policyPort struct {
		Protocol string `json:"protocol"`
		Port     any    `json:"port"`
	}
	scaledObject struct {
		Spec struct {
			ScaleTargetRef struct {
				Name string `json:"name"`
			} `json:"scaleTargetRef"`
			MinReplicaCount *int `json:"minReplicaCount"`
			MaxReplicaCount *int `json:"maxReplicaCount"`
			Triggers        []struct {
				Type              string            `json:"type"`
				Metadata          map[string]string `json:"metadata"`
				AuthenticationRef *struct {
					Name string `json:"name"`
				} `json:"authenticationRef"`
			} `json:"triggers"`
		} `json:"spec"`
	}
)

// ProbeHandlers are the container's probes.
func (c container) probes() map[string]*probe {
	return map[string]*probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe}
}

// UnmarshalJSON reads the probes under their JSON names.
func (c *container) UnmarshalJSON(b []byte) error {
	type plain container
	var p struct {
		plain
		StartupProbe   *probe `json:"startupProbe"`
		LivenessProbe  *probe `json:"livenessProbe"`
		ReadinessProbe *probe `json:"readinessProbe"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*c = container(p.plain)
	c.StartupProbe, c.LivenessProbe, c.ReadinessProbe = p.StartupProbe, p.LivenessProbe, p.ReadinessProbe
	return nil
}

// render builds a kustomization under deploy/k8s with kustomize, as
// `kubectl kustomize` would, and returns its objects.
func render(t *testing.T, dir string) []object {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	abs, err := filepath.Abs(filepath.Join("k8s", dir))
	if err != nil {
		t.Fatal(err)
	}
	rm, err := k.Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []object
	for _, r := range rm.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		o := object{raw: m}
		decode(t, m, &o)
		out = append(out, o)
	}
	return out
}

func decode(t *testing.T, from, into any) {
	t.Helper()
	b, err := json.Marshal(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, into); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
}

func find(objs []object, kind, name string) (object, bool) {
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Name == name {
			return o, true
		}
	}
	return object{}, false
}

// selects reports whether a selector selects pods labelled labels.
func (s selector) selects(labels map[string]string) bool {
	for k, v := range s.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	for _, e := range s.MatchExpressions {
		v, ok := labels[e.Key]
		switch e.Operator {
		case "In":
			if !ok || !slices.Contains(e.Values, v) {
				return false
			}
		case "NotIn":
			if ok && slices.Contains(e.Values, v) {
				return false
			}
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		}
	}
	return true
}

// pendingVars are variables the manifests set for features on their way to
// main (another branch): allowed although the service does not read them yet.
var pendingVars = map[string]map[string]string{}

// adminPaths answers which paths the services' admin server serves.
func adminServes(t *testing.T, path string) bool {
	t.Helper()
	a, err := service.NewAdmin(service.AdminConfig{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code != http.StatusNotFound
}

func TestKustomize(t *testing.T) {
	if adminServes(t, "/no-such-path") {
		t.Fatal("the admin server answers an unknown path: the probe check would see every path")
	}
	for _, overlay := range []string{"base", "overlays/production", "overlays/production-hpa"} {
		t.Run(strings.ReplaceAll(overlay, "/", "_"), func(t *testing.T) {
			objs := render(t, overlay)
			configMaps := map[string]map[string]string{}
			for _, o := range objs {
				if o.Kind == "ConfigMap" {
					configMaps[o.Metadata.Name] = o.Data
				}
				if overlay != "base" && o.Metadata.Namespace != "autoprov" {
					t.Errorf("%s %s: namespace %q, want autoprov", o.Kind, o.Metadata.Name, o.Metadata.Namespace)
				}
			}
			pods := map[string]map[string]string{}
			for _, svc := range services {
				o, ok := find(objs, "Deployment", svc)
				if !ok {
					t.Errorf("no Deployment %s", svc)
					continue
				}
				var d deployment
				decode(t, o.raw, &d)
				pods[svc] = d.Spec.Template.Metadata.Labels
				checkDeployment(t, svc, d, configMaps)
				checkPDB(t, objs, svc, d.Spec.Template.Metadata.Labels)
			}
			checkNetworkPolicies(t, objs, pods)
			switch overlay {
			case "overlays/production":
				checkScaledObject(t, objs, configMaps)
				if _, ok := find(objs, "HorizontalPodAutoscaler", "infra"); ok {
					t.Error("an HPA next to KEDA's ScaledObject: they would fight over infra's replicas")
				}
			case "overlays/production-hpa":
				checkHPA(t, objs)
				if _, ok := find(objs, "ScaledObject", "infra"); ok {
					t.Error("a ScaledObject in the HPA fallback")
				}
			}
		})
	}
}

func checkDeployment(t *testing.T, svc string, d deployment, configMaps map[string]map[string]string) {
	t.Helper()
	if !d.Spec.Selector.selects(d.Spec.Template.Metadata.Labels) {
		t.Errorf("%s: the selector does not select its own pods", svc)
	}
	if len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", svc, len(d.Spec.Template.Spec.Containers))
	}
	c := d.Spec.Template.Spec.Containers[0]
	vars := serviceVars(t, svc)
	wantPort, _ := strconv.Atoi(adminPort(t, vars["ADMIN_ADDR"]))

	// Environment: names the service reads; secrets only from Secrets.
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "(secret " + e.ValueFrom.SecretKeyRef.Name + ")"
		case secretName.MatchString(e.Name) && !strings.HasSuffix(e.Name, "_FILE") && !strings.HasSuffix(e.Name, "_REF"):
			t.Errorf("%s: %s has a literal value: take it from a Secret", svc, e.Name)
		default:
			env[e.Name] = e.Value
		}
	}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil {
			continue
		}
		data, ok := configMaps[ef.ConfigMapRef.Name]
		if !ok {
			t.Errorf("%s: envFrom ConfigMap %s is not rendered", svc, ef.ConfigMapRef.Name)
		}
		for k, v := range data {
			if _, set := env[k]; !set {
				env[k] = v
			}
		}
	}
	for k := range env {
		if _, ok := vars[k]; ok {
			continue
		}
		if why, ok := pendingVars[svc][k]; ok {
			t.Logf("%s: %s is set for %s, which %s does not read yet", svc, k, why, svc)
			continue
		}
		t.Errorf("%s: sets %s, which %s does not read", svc, k, svc)
	}
	for _, k := range []string{"DATABASE_URL", "REDIS_URL"} {
		if !strings.HasPrefix(env[k], "(secret ") {
			t.Errorf("%s: %s is not taken from a Secret", svc, k)
		}
	}
	if got := env["ADMIN_ADDR"]; got != "0.0.0.0:"+strconv.Itoa(wantPort) {
		t.Errorf("%s: ADMIN_ADDR %q, want 0.0.0.0:%d (the service's port, on the pod's address)", svc, got, wantPort)
	}

	// Ports and probes: the admin port is the service's default, the probes
	// ask it for paths the admin server serves.
	adminPortOK := false
	for _, p := range c.Ports {
		if p.Name == "admin" && p.ContainerPort == wantPort {
			adminPortOK = true
		}
	}
	if !adminPortOK {
		t.Errorf("%s: no container port admin=%d", svc, wantPort)
	}
	for kind, p := range c.probes() {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: no %s probe", svc, kind)
			continue
		}
		if p.HTTPGet.Port != "admin" && p.HTTPGet.Port != float64(wantPort) {
			t.Errorf("%s: %s probe on port %v, want the admin port", svc, kind, p.HTTPGet.Port)
		}
		if !adminServes(t, p.HTTPGet.Path) {
			t.Errorf("%s: %s probe path %s: the admin server has no such endpoint", svc, kind, p.HTTPGet.Path)
		}
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("%s: readiness probe %s, want /readyz (it turns 503 while draining)", svc, c.ReadinessProbe.HTTPGet.Path)
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("%s: liveness probe %s, want /healthz (a Redis outage must not restart the pod)", svc, c.LivenessProbe.HTTPGet.Path)
	}

	// Resources and security.
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("%s: resources %+v: want cpu and memory requests and a memory limit", svc, c.Resources)
	}
	if sc := c.SecurityContext; sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: securityContext must set runAsNonRoot and forbid privilege escalation", svc)
	}

	// The kubelet's SIGKILL must not cut the drain short.
	grace, err := time.ParseDuration(env["SHUTDOWN_GRACE"])
	if err != nil {
		t.Errorf("%s: SHUTDOWN_GRACE %q: %v", svc, env["SHUTDOWN_GRACE"], err)
		return
	}
	tg := d.Spec.Template.Spec.TerminationGracePeriodSeconds
	if tg == nil {
		t.Errorf("%s: terminationGracePeriodSeconds unset (30s): shorter than SHUTDOWN_GRACE %s", svc, grace)
	} else if time.Duration(*tg)*time.Second < grace+15*time.Second {
		t.Errorf("%s: terminationGracePeriodSeconds %d is not SHUTDOWN_GRACE (%s) plus a margin", svc, *tg, grace)
	}
	if svc == "infra" && grace < 5*time.Minute {
		t.Errorf("infra: SHUTDOWN_GRACE %s: a running play may take minutes; drain for longer", grace)
	}
}

func checkPDB(t *testing.T, objs []object, svc string, labels map[string]string) {
	t.Helper()
	for _, o := range objs {
		if o.Kind != "PodDisruptionBudget" {
			continue
		}
		var pdb struct {
			Spec struct {
				Selector       selector `json:"selector"`
				MaxUnavailable any      `json:"maxUnavailable"`
				MinAvailable   any      `json:"minAvailable"`
			} `json:"spec"`
		}
		decode(t, o.raw, &pdb)
		if pdb.Spec.Selector.selects(labels) {
			if pdb.Spec.MaxUnavailable == nil {
				t.Errorf("PDB %s: maxUnavailable unset (minAvailable on a single replica blocks node drains)", o.Metadata.Name)
			}
			return
		}
	}
	t.Errorf("%s: no PodDisruptionBudget selects its pods", svc)
}

func checkNetworkPolicies(t *testing.T, objs []object, pods map[string]map[string]string) {
	t.Helper()
	denyAll := map[string]bool{}
	for _, o := range objs {
		if o.Kind != "NetworkPolicy" {
			continue
		}
		var np networkPolicy
		decode(t, o.raw, &np)
		var selected []string
		for svc, labels := range pods {
			if np.Spec.PodSelector.selects(labels) {
				selected = append(selected, svc)
			}
		}
		slices.Sort(selected)
		if len(np.Spec.Ingress) == 0 && len(np.Spec.Egress) == 0 && slices.Contains(np.Spec.PolicyTypes, "Ingress") && slices.Contains(np.Spec.PolicyTypes, "Egress") {
			for _, s := range selected {
				denyAll[s] = true
			}
		}
		for _, e := range np.Spec.Egress {
			for _, p := range e.Ports {
				if p.Port == float64(22) && !slices.Equal(selected, []string{"infra"}) {
					t.Errorf("NetworkPolicy %s lets %v reach SSH (22): only infra may", o.Metadata.Name, selected)
				}
			}
			if len(e.Ports) == 0 {
				t.Errorf("NetworkPolicy %s: an egress rule without ports allows everything", o.Metadata.Name)
			}
		}
		for _, in := range np.Spec.Ingress {
			if len(in.From) == 0 && !slices.Equal(selected, []string{"deployer"}) {
				t.Errorf("NetworkPolicy %s lets anyone reach %v: only the deployer is reached from outside", o.Metadata.Name, selected)
			}
			if len(in.From) == 0 {
				for _, p := range in.Ports {
					if p.Port != "api" {
						t.Errorf("NetworkPolicy %s opens the deployer's port %v to everyone, want only its API", o.Metadata.Name, p.Port)
					}
				}
			}
		}
	}
	for svc := range pods {
		if !denyAll[svc] {
			t.Errorf("no default-deny NetworkPolicy selects %s", svc)
		}
	}
}

func checkScaledObject(t *testing.T, objs []object, configMaps map[string]map[string]string) {
	t.Helper()
	o, ok := find(objs, "ScaledObject", "infra")
	if !ok {
		t.Fatal("no ScaledObject infra")
	}
	var so scaledObject
	decode(t, o.raw, &so)
	if so.Spec.ScaleTargetRef.Name != "infra" {
		t.Errorf("ScaledObject scales %q", so.Spec.ScaleTargetRef.Name)
	}
	if so.Spec.MinReplicaCount == nil || *so.Spec.MinReplicaCount != 1 || so.Spec.MaxReplicaCount == nil || *so.Spec.MaxReplicaCount <= 1 {
		t.Errorf("ScaledObject replicas %v..%v, want 1..N", so.Spec.MinReplicaCount, so.Spec.MaxReplicaCount)
	}
	group := serviceVars(t, "infra")["STREAM_GROUP"]
	if cm := configMaps["autoprov-infra"]["STREAM_GROUP"]; cm != "" && cm != group {
		t.Errorf("the manifests set STREAM_GROUP=%s but the scaler watches %s", cm, group)
	}
	type key struct{ stream, mode string }
	seen := map[key]bool{}
	for _, tr := range so.Spec.Triggers {
		m := tr.Metadata
		if tr.Type != "redis-streams" {
			t.Errorf("trigger type %q, want redis-streams", tr.Type)
			continue
		}
		if m["consumerGroup"] != group {
			t.Errorf("trigger on %s watches group %q, infra's group is %q", m["stream"], m["consumerGroup"], group)
		}
		if tr.AuthenticationRef == nil {
			t.Errorf("trigger on %s has no authenticationRef (Redis password)", m["stream"])
		} else if _, ok := find(objs, "TriggerAuthentication", tr.AuthenticationRef.Name); !ok {
			t.Errorf("TriggerAuthentication %s is not rendered", tr.AuthenticationRef.Name)
		}
		switch {
		case m["lagCount"] != "":
			seen[key{m["stream"], "lag"}] = true
		case m["pendingEntriesCount"] != "":
			seen[key{m["stream"], "pending"}] = true
		default:
			t.Errorf("trigger on %s counts neither lag nor pending entries", m["stream"])
		}
	}
	queues := []string{messages.StreamProvisionerQueue, messages.StreamAnsibleDeployQueue, messages.StreamAnsibleJobQueue}
	for _, s := range queues {
		for _, mode := range []string{"lag", "pending"} {
			if !seen[key{s, mode}] {
				t.Errorf("no %s trigger on %s", mode, s)
			}
		}
	}
	if len(seen) != 2*len(queues) {
		t.Errorf("triggers on %v: want lag and pending on exactly the request queues infra serves by default", seen)
	}
}

func checkHPA(t *testing.T, objs []object) {
	t.Helper()
	o, ok := find(objs, "HorizontalPodAutoscaler", "infra")
	if !ok {
		t.Fatal("no HPA infra in the fallback")
	}
	var hpa struct {
		Spec struct {
			MinReplicas *int `json:"minReplicas"`
			Metrics     []struct {
				External struct {
					Metric struct {
						Name     string   `json:"name"`
						Selector selector `json:"selector"`
					} `json:"metric"`
				} `json:"external"`
			} `json:"metrics"`
		} `json:"spec"`
	}
	decode(t, o.raw, &hpa)
	exported := exportedStreamMetrics(t)
	group := serviceVars(t, "infra")["STREAM_GROUP"]
	if len(hpa.Spec.Metrics) == 0 {
		t.Error("HPA has no metrics")
	}
	for _, m := range hpa.Spec.Metrics {
		if !exported[m.External.Metric.Name] {
			t.Errorf("HPA scales on %s, which no service exports", m.External.Metric.Name)
		}
		if m.External.Metric.Selector.MatchLabels["group"] != group {
			t.Errorf("HPA metric %s selects group %q, want %q", m.External.Metric.Name, m.External.Metric.Selector.MatchLabels["group"], group)
		}
	}
}

// exportedStreamMetrics lists the metric names pkg/stream registers (the
// stream metrics every consumer exports), from their descriptions: vectors
// without children gather nothing.
func exportedStreamMetrics(t *testing.T) map[string]bool {
	t.Helper()
	rec := &describeRecorder{names: map[string]bool{}}
	stream.NewMetrics(rec)
	if len(rec.names) == 0 {
		t.Fatal("pkg/stream registered no metric")
	}
	return rec.names
}

// describeRecorder is a prometheus.Registerer that records the names of
// what is registered with it.
type describeRecorder struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *describeRecorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return nil
}

func (r *describeRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

func (r *describeRecorder) Unregister(prometheus.Collector) bool { return true }
