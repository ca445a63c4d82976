package jobs

import (
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
)

// step is one part of a job's own time (see steps).
type step int

// The steps of a job, in the order a job usually takes them. Their names
// are the values of the step label of autoprov_infra_job_step_seconds and,
// with "step_" before and "_ms" after, fields of the "job finished" line.
const (
	stepPickup        step = iota // a slot free and the entry in its stream, the handler not started yet (stream.Message.Pickup): the idle time between runs
	stepDecode                    // decoding and validating the request
	stepServerLookup              // reading the server (or finding it by address)
	stepInventory                 // an Ansible job's hosts: its inventory resolved, each host found
	stepAuthorization             // the target and the secret references (package authz)
	stepLocks                     // taking the job's and the server's locks
	stepCheckout                  // an Ansible job's source fetched and checked out
	stepRequirements              // an Ansible job's Galaxy requirements installed (or copied from the cache)
	stepPlaybooks                 // an Ansible job's playbooks found in the checkout, or its role's play generated
	stepRunRecord                 // the run row and the server's transition before the play
	stepSecrets                   // resolving the SSH key and the request's secrets
	stepSSHCheck                  // the SSH check (0 when a recent one was reused)
	stepRunDir                    // the run directory and its inputs (package ansible)
	stepAgent                     // the run's in-process ssh-agent
	stepTakeover                  // waiting for the takeover of the target (it runs while ansible-playbook starts)
	stepProcessStart              // exec to ansible-playbook running (runguard included)
	stepPlay                      // ansible-playbook running
	stepLogStore                  // storing the run's full output (pkg/runlog)
	stepResult                    // storing the outcome and publishing the result
	numSteps
)

var stepNames = [numSteps]string{
	stepPickup:        "pickup",
	stepDecode:        "decode",
	stepServerLookup:  "server_lookup",
	stepInventory:     "inventory",
	stepAuthorization: "authorization",
	stepLocks:         "locks",
	stepCheckout:      "checkout",
	stepRequirements:  "requirements",
	stepPlaybooks:     "playbooks",
	stepRunRecord:     "run_record",
	stepSecrets:       "secrets",
	stepSSHCheck:      "ssh_check",
	stepRunDir:        "run_dir",
	stepAgent:         "agent",
	stepTakeover:      "takeover",
	stepProcessStart:  "process_start",
	stepPlay:          "play",
	stepLogStore:      "log_store",
	stepResult:        "result",
}

func (s step) String() string { return stepNames[s] }

// steps accumulate a job's time per step (a job with several plays counts
// each step of each play). Measured on the monotonic clock, whatever the
// handler's clock: they are durations of this process's own work.
type steps struct {
	d    [numSteps]time.Duration
	seen [numSteps]bool
}

// add counts the time since start to s and returns now, so that
// consecutive steps chain: at = j.steps.add(stepX, at).
func (st *steps) add(s step, start time.Time) time.Time {
	now := time.Now()
	st.d[s] += now.Sub(start)
	st.seen[s] = true
	return now
}

// set counts d to s.
func (st *steps) set(s step, d time.Duration) {
	st.d[s] = d
	st.seen[s] = true
}

// addRun counts the runner's steps of one play: its own, and the play's.
func (st *steps) addRun(rs ansible.Steps) {
	for s, d := range map[step]time.Duration{stepRunDir: rs.RunDir, stepAgent: rs.Agent,
		stepTakeover: rs.TakeoverWait, stepProcessStart: rs.Start, stepPlay: rs.Play} {
		st.d[s] += d
		st.seen[s] = true
	}
}

// observe records the steps the job took in the step histogram.
func (st *steps) observe(m *Metrics) {
	for s := range numSteps {
		if st.seen[s] {
			m.steps.WithLabelValues(stepNames[s]).Observe(st.d[s].Seconds())
		}
	}
}

// log adds the steps the job took to ev as step_<name>_ms fields.
func (st *steps) log(ev *zerolog.Event) *zerolog.Event {
	for s := range numSteps {
		if st.seen[s] {
			ev = ev.Float64("step_"+stepNames[s]+"_ms", ms(st.d[s]))
		}
	}
	return ev
}
