package rules

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Holder holds the current rules and reloads them on SIGHUP or when the
// file changes. A reload that fails keeps the rules in force and logs the
// problems with file, line and rule.
type Holder struct {
	path, playbookDir string
	log               zerolog.Logger
	cur               atomic.Pointer[Set]
	reloads           *prometheus.CounterVec
	loaded            prometheus.Gauge
	// Reloaded, when not nil, receives the result of every reload (tests).
	Reloaded chan error
	// watching is closed once Run watches the file (tests).
	watching chan struct{}
}

// NewHolder loads the rules file (an error stops the service at start) and
// returns a Holder serving them. reg may be nil.
func NewHolder(path, playbookDir string, log zerolog.Logger, reg prometheus.Registerer) (*Holder, error) {
	set, err := Load(path, playbookDir)
	if err != nil {
		return nil, err
	}
	h := &Holder{path: path, playbookDir: playbookDir, log: log, watching: make(chan struct{}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "autoprov_scheduler_rules_reloads_total", Help: "Reloads of the rules file, by result (ok, error).",
		}, []string{"result"}),
		loaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "autoprov_scheduler_rules", Help: "Rules in force.",
		}),
	}
	if reg != nil {
		reg.MustRegister(h.reloads, h.loaded)
	}
	h.cur.Store(set)
	h.loaded.Set(float64(len(set.Rules)))
	log.Info().Str("file", path).Int("rules", len(set.Rules)).Msg("rules loaded")
	return h, nil
}

// Rules returns the rules in force.
func (h *Holder) Rules() *Set { return h.cur.Load() }

// Reload reads the file again; on error the rules in force stay.
func (h *Holder) Reload() error {
	set, err := Load(h.path, h.playbookDir)
	if err != nil {
		h.reloads.WithLabelValues("error").Inc()
		h.log.Error().Err(err).Str("file", h.path).Msg("rules reload failed: keeping the rules in force")
	} else {
		h.cur.Store(set)
		h.reloads.WithLabelValues("ok").Inc()
		h.loaded.Set(float64(len(set.Rules)))
		h.log.Info().Str("file", h.path).Int("rules", len(set.Rules)).Msg("rules reloaded")
	}
	if h.Reloaded != nil {
		select {
		case h.Reloaded <- err:
		default:
		}
	}
	return err
}

// Run reloads on SIGHUP and on changes of the file until ctx is done. The
// directory is watched, not the file, so editors that replace the file
// (write a new one, rename it over) are seen too; bursts of events are
// coalesced.
func (h *Holder) Run(ctx context.Context) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var events <-chan fsnotify.Event
	if h.path != "" {
		w, err := fsnotify.NewWatcher()
		if err == nil {
			defer w.Close()
			if err := w.Add(filepath.Dir(h.path)); err != nil {
				h.log.Warn().Err(err).Msg("cannot watch the rules file: reload with SIGHUP")
			} else {
				events = w.Events
			}
		}
	}
	close(h.watching)
	var debounce <-chan time.Time
	name := filepath.Clean(h.path)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
			h.log.Info().Msg("SIGHUP: reloading the rules")
			_ = h.Reload()
		case ev := <-events:
			if filepath.Clean(ev.Name) == name && ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename) != 0 {
				debounce = time.After(200 * time.Millisecond)
			}
		case <-debounce:
			debounce = nil
			_ = h.Reload()
		}
	}
}
