//go:build containers

package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
)

// podman runs podman with deploy/podman/containers.conf (runc, no default
// ulimits: this machine cannot raise them) and returns its trimmed stdout.
func podman(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "podman", args...)
	conf, _ := filepath.Abs(filepath.Join(root, "deploy", "podman", "containers.conf"))
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+conf)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return strings.TrimSpace(out.String()), fmt.Errorf("podman %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// localImages maps the compose file's public images to the ones
// scripts/containers.sh builds from the local Debian base.
var localImages = map[string]string{
	"redis:7.4.6-bookworm":    "localhost/autoprov-local/redis:dev",
	"postgres:15.14-bookworm": "localhost/autoprov-local/postgres:dev",
}

// stack is a docker-compose.yml project run with plain podman commands:
// its containers, network and volumes are named after the project, which
// is unique per test, and labelled with it; Down removes them all.
type stack struct {
	t       *testing.T
	project *types.Project
	name    string // project name: prefix of every container, volume and network
	network string
	envDir  string // per-container env files (0600), removed after start
	// replicas counts the containers started per service.
	replicas map[string]int
	// order lists the services in the order they were first started.
	order []string
	// lastWords holds, after Down, the last lines of each container that
	// exited with a status other than 0: what it said as it failed.
	lastWords map[string]string
}

// newStack creates the project's network and volumes.
func newStack(ctx context.Context, t *testing.T, project *types.Project) *stack {
	t.Helper()
	s := &stack{t: t, project: project, name: project.Name, network: project.Name + "_default",
		envDir: t.TempDir(), replicas: map[string]int{}}
	t.Cleanup(func() { s.Down(context.Background()) })
	if _, err := podman(ctx, "network", "create", "--label", "io.autoprov.test="+s.name, s.network); err != nil {
		t.Fatal(err)
	}
	for vol := range project.Volumes {
		if _, err := podman(ctx, "volume", "create", "--label", "io.autoprov.test="+s.name, s.volume(vol)); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func (s *stack) volume(name string) string { return s.name + "_" + name }

// container names replica n (1-based) of a service.
func (s *stack) container(svc string, n int) string { return fmt.Sprintf("%s-%s-%d", s.name, svc, n) }

// runArgs translates one compose service into `podman run` arguments: what
// docker compose would do with it, but the image (localImages) and build.
func (s *stack) runArgs(svc types.ServiceConfig, name, envFile string) []string {
	args := []string{"run", "-d", "--name", name, "--label", "io.autoprov.test=" + s.name,
		"--network", s.network, "--network-alias", svc.Name, "--env-file", envFile}
	if svc.User != "" {
		args = append(args, "--user", svc.User)
	}
	for _, v := range svc.Volumes {
		opt := ""
		if v.ReadOnly {
			opt = ":ro"
		}
		src := v.Source
		if v.Type == types.VolumeTypeVolume {
			src = s.volume(v.Source)
		}
		args = append(args, "-v", src+":"+v.Target+opt)
	}
	for _, p := range svc.Ports {
		args = append(args, "-p", fmt.Sprintf("%s:%s:%d", p.HostIP, p.Published, p.Target))
	}
	for _, c := range svc.CapAdd {
		args = append(args, "--cap-add", c)
	}
	for _, c := range svc.CapDrop {
		args = append(args, "--cap-drop", c)
	}
	for _, o := range svc.SecurityOpt {
		args = append(args, "--security-opt", o)
	}
	if hc := svc.HealthCheck; hc != nil && len(hc.Test) > 0 {
		args = append(args, "--health-cmd", healthCmd(hc.Test))
		if hc.Interval != nil {
			args = append(args, "--health-interval", time.Duration(*hc.Interval).String())
		}
		if hc.Retries != nil {
			args = append(args, "--health-retries", fmt.Sprint(*hc.Retries))
		}
	}
	if svc.StopGracePeriod != nil {
		args = append(args, "--stop-timeout", fmt.Sprint(int(time.Duration(*svc.StopGracePeriod).Seconds())))
	}
	switch svc.Restart {
	case "", "no":
	default:
		args = append(args, "--restart", svc.Restart)
	}
	if len(svc.Entrypoint) > 0 {
		ep, _ := json.Marshal([]string(svc.Entrypoint))
		args = append(args, "--entrypoint", string(ep))
	}
	image := svc.Image
	if local, ok := localImages[image]; ok {
		image = local
	} else if !strings.HasPrefix(image, "localhost/") {
		image = "localhost/" + image
	}
	args = append(args, image)
	return append(args, svc.Command...)
}

// healthCmd turns a compose health check test into podman 4's
// --health-cmd, a shell command: CMD's arguments quoted, CMD-SHELL's as is.
func healthCmd(test types.HealthCheckTest) string {
	if len(test) > 0 && test[0] == "CMD-SHELL" {
		return strings.Join(test[1:], " ")
	}
	quoted := make([]string, 0, len(test))
	for _, a := range test[1:] {
		quoted = append(quoted, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
	}
	return strings.Join(quoted, " ")
}

// Start starts one more replica of a service, after waiting for the
// conditions of its depends_on, and returns its container name.
func (s *stack) Start(ctx context.Context, name string) string {
	s.t.Helper()
	svc, ok := s.project.Services[name]
	if !ok {
		s.t.Fatalf("no service %s", name)
	}
	deps := make([]string, 0, len(svc.DependsOn))
	for dep := range svc.DependsOn {
		deps = append(deps, dep)
	}
	sort.Strings(deps)
	for _, dep := range deps {
		switch cond := svc.DependsOn[dep].Condition; cond {
		case types.ServiceConditionHealthy:
			s.WaitHealthy(ctx, s.container(dep, 1), 3*time.Minute)
		case types.ServiceConditionCompletedSuccessfully:
			if code := s.Wait(ctx, s.container(dep, 1)); code != 0 {
				s.t.Fatalf("%s depends on %s completing successfully: it exited %d\n%s", name, dep, code, s.Logs(ctx, s.container(dep, 1)))
			}
		}
	}
	if !slices.Contains(s.order, name) {
		s.order = append(s.order, name)
	}
	s.replicas[name]++
	cname := s.container(name, s.replicas[name])
	// The environment goes through a file (never podman's argv: it holds
	// passwords), removed once the container has started.
	var env strings.Builder
	keys := make([]string, 0, len(svc.Environment))
	for k := range svc.Environment {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if v := svc.Environment[k]; v != nil {
			fmt.Fprintf(&env, "%s=%s\n", k, *v)
		}
	}
	envFile := filepath.Join(s.envDir, cname+".env")
	if err := os.WriteFile(envFile, []byte(env.String()), 0o600); err != nil {
		s.t.Fatal(err)
	}
	defer os.Remove(envFile)
	start := time.Now()
	if _, err := podman(ctx, s.runArgs(svc, cname, envFile)...); err != nil {
		s.t.Fatal(err)
	}
	s.t.Logf("started %s (%s)", cname, time.Since(start).Round(time.Millisecond))
	return cname
}

// WaitHealthy runs the container's health check (the compose file's test,
// run inside it) until it passes.
func (s *stack) WaitHealthy(ctx context.Context, cname string, limit time.Duration) {
	s.t.Helper()
	start := time.Now()
	var last error
	for time.Since(start) < limit {
		if _, last = podman(ctx, "healthcheck", "run", cname); last == nil {
			s.t.Logf("%s healthy after %s", cname, time.Since(start).Round(100*time.Millisecond))
			return
		}
		state, _ := podman(ctx, "inspect", "--format", "{{.State.Status}}", cname)
		if state == "exited" {
			s.t.Fatalf("%s exited before it was healthy; its last lines:\n%s", cname, lastLines(s.Logs(ctx, cname), 40))
		}
		time.Sleep(time.Second)
	}
	s.t.Fatalf("%s not healthy within %s (%v); its last lines:\n%s", cname, limit, last, lastLines(s.Logs(ctx, cname), 40))
}

// Wait waits for a container to exit and returns its exit code. podman
// wait forgets the exit code of a container that exited some minutes ago
// ("no such exit code", podman keeps them 5 minutes): the container's
// state, which keeps it, answers then.
func (s *stack) Wait(ctx context.Context, cname string) int {
	s.t.Helper()
	code, err := s.WaitExit(ctx, cname)
	if err != nil {
		s.t.Fatal(err)
	}
	return code
}

// WaitExit is Wait that returns its failure (ctx ended, the container
// did not exit).
func (s *stack) WaitExit(ctx context.Context, cname string) (int, error) {
	out, err := podman(ctx, "wait", cname)
	if err != nil {
		// The state is read without ctx, which may be what ended.
		state, ierr := podman(context.WithoutCancel(ctx), "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", cname)
		var status string
		var code int
		if _, serr := fmt.Sscan(state, &status, &code); ierr != nil || serr != nil || status != "exited" {
			return -1, fmt.Errorf("wait for %s: %v (state %q: %v)", cname, err, state, ierr)
		}
		return code, nil
	}
	var code int
	fmt.Sscan(out, &code)
	return code, nil
}

// Logs returns a container's output (stdout and stderr).
func (s *stack) Logs(ctx context.Context, cname string) string {
	cmd := exec.CommandContext(ctx, "podman", "logs", cname)
	conf, _ := filepath.Abs(filepath.Join(root, "deploy", "podman", "containers.conf"))
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+conf)
	out, _ := cmd.CombinedOutput()
	return string(out)
}

// Exec runs a command in a container and returns its output.
func (s *stack) Exec(ctx context.Context, cname string, cmd ...string) (string, error) {
	return podman(ctx, append([]string{"exec", cname}, cmd...)...)
}

// Down stops the stack as docker compose down does: service by service in
// the reverse order of their start (those that depend on others first,
// Redis and Postgres last), each container within its stop grace period;
// then it removes the containers, the network and the volumes, all found by
// the project's label, and returns each container's exit code. A second
// call finds nothing.
func (s *stack) Down(ctx context.Context) map[string]int {
	label := "label=io.autoprov.test=" + s.name
	codes := map[string]int{}
	start := time.Now()
	for i := len(s.order) - 1; i >= 0; i-- {
		svc := s.order[i]
		var names []string
		for n := 1; n <= s.replicas[svc]; n++ {
			names = append(names, s.container(svc, n))
		}
		if len(names) == 0 {
			continue
		}
		if _, err := podman(ctx, append([]string{"stop", "--ignore"}, names...)...); err != nil {
			s.t.Errorf("%s did not stop cleanly: %v", svc, err)
		}
	}
	ids, _ := podman(ctx, "ps", "-aq", "--filter", label)
	if ids != "" {
		// Anything not started through Start.
		if _, err := podman(ctx, append([]string{"stop"}, strings.Fields(ids)...)...); err != nil {
			s.t.Errorf("stack did not stop cleanly: %v", err)
		}
		s.t.Logf("stack stopped in %s", time.Since(start).Round(100*time.Millisecond))
		for _, id := range strings.Fields(ids) {
			out, _ := podman(ctx, "inspect", "--format", "{{.Name}} {{.State.ExitCode}}", id)
			var name string
			var code int
			fmt.Sscan(out, &name, &code)
			codes[name] = code
			if code != 0 {
				if s.lastWords == nil {
					s.lastWords = map[string]string{}
				}
				s.lastWords[name] = lastLines(s.Logs(ctx, id), 25)
			}
		}
		_, _ = podman(ctx, append([]string{"rm", "-f"}, strings.Fields(ids)...)...)
	}
	s.order, s.replicas = nil, map[string]int{}
	if vols, _ := podman(ctx, "volume", "ls", "-q", "--filter", label); vols != "" {
		_, _ = podman(ctx, append([]string{"volume", "rm", "-f"}, strings.Fields(vols)...)...)
	}
	_, _ = podman(ctx, "network", "rm", "-f", s.network)
	return codes
}

// randomHex returns n random bytes as hex.
func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// freeLoopbackPort returns a port free on 127.0.0.1.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// dropEnv removes variables from a service's environment.
func dropEnv(svc *types.ServiceConfig, keys ...string) {
	for k := range svc.Environment {
		if slices.Contains(keys, k) {
			delete(svc.Environment, k)
		}
	}
}
