package runlog

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
)

// The backends Config.Backend may name.
const (
	BackendPostgres = "postgres"
	BackendDir      = "dir"
	BackendS3       = "s3"
)

// Config selects and configures the run log backend. Services embed it in
// their own configuration (caarlos0/env tags; desc is the --help text).
type Config struct {
	Backend   string        `env:"RUNLOG_BACKEND" envDefault:"postgres" desc:"where full run logs are kept: postgres, dir or s3"`
	Dir       string        `env:"RUNLOG_DIR" desc:"directory of the dir backend (absolute)"`
	MaxBytes  int64         `env:"RUNLOG_MAX_BYTES" envDefault:"16777216" desc:"longest log kept, in bytes; a longer run keeps its first and last halves"`
	Retention time.Duration `env:"RUNLOG_RETENTION" envDefault:"720h" desc:"how long run logs are kept (0 keeps them forever)"`
	S3        S3Config
}

// S3Config configures the s3 backend.
type S3Config struct {
	Endpoint      string        `env:"RUNLOG_S3_ENDPOINT" desc:"S3 endpoint URL, e.g. https://s3.eu-west-1.amazonaws.com or http://127.0.0.1:9000"`
	Bucket        string        `env:"RUNLOG_S3_BUCKET" desc:"bucket of the run logs"`
	Prefix        string        `env:"RUNLOG_S3_PREFIX" envDefault:"runs/" desc:"key prefix of the run logs in the bucket"`
	Region        string        `env:"RUNLOG_S3_REGION" desc:"S3 region (empty: the endpoint's default)"`
	AccessKey     string        `env:"RUNLOG_S3_ACCESS_KEY" desc:"S3 access key id"`
	SecretKey     secrets.Value `env:"RUNLOG_S3_SECRET_KEY,unset" secret:"true" desc:"S3 secret access key (removed from the environment once read)"`
	SecretKeyFile string        `env:"RUNLOG_S3_SECRET_KEY_FILE" desc:"file holding the S3 secret access key"`
	PathStyle     bool          `env:"RUNLOG_S3_PATH_STYLE" envDefault:"true" desc:"address buckets by path (MinIO, most self-hosted servers) rather than by host name"`
	Timeout       time.Duration `env:"RUNLOG_S3_TIMEOUT" envDefault:"60s" desc:"timeout of one S3 request"`
}

// Validate checks the configuration of the selected backend.
func (c *Config) Validate() error {
	var errs []error
	switch c.Backend {
	case BackendPostgres:
	case BackendDir:
		if !filepath.IsAbs(c.Dir) {
			errs = append(errs, errors.New("RUNLOG_DIR: must be an absolute directory with RUNLOG_BACKEND=dir"))
		}
	case BackendS3:
		errs = append(errs, c.S3.validate()...)
	default:
		errs = append(errs, fmt.Errorf("RUNLOG_BACKEND: %q is not one of postgres, dir, s3", c.Backend))
	}
	if c.MaxBytes < 1024 {
		errs = append(errs, errors.New("RUNLOG_MAX_BYTES: must be at least 1024"))
	}
	if c.Retention < 0 {
		errs = append(errs, errors.New("RUNLOG_RETENTION: must not be negative"))
	}
	return errors.Join(errs...)
}

func (c *S3Config) validate() []error {
	var errs []error
	u, err := url.Parse(c.Endpoint)
	switch {
	case c.Endpoint == "":
		errs = append(errs, errors.New("RUNLOG_S3_ENDPOINT: required with RUNLOG_BACKEND=s3"))
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		errs = append(errs, errors.New("RUNLOG_S3_ENDPOINT: must be an http:// or https:// URL with a host"))
	case u.User != nil:
		errs = append(errs, errors.New("RUNLOG_S3_ENDPOINT: must not hold credentials"))
	case u.Path != "" && u.Path != "/":
		errs = append(errs, errors.New("RUNLOG_S3_ENDPOINT: must not have a path"))
	}
	if c.Bucket == "" {
		errs = append(errs, errors.New("RUNLOG_S3_BUCKET: required with RUNLOG_BACKEND=s3"))
	}
	if !c.SecretKey.IsZero() && c.SecretKeyFile != "" {
		errs = append(errs, errors.New("RUNLOG_S3_SECRET_KEY and RUNLOG_S3_SECRET_KEY_FILE: set only one"))
	}
	if c.AccessKey == "" && (!c.SecretKey.IsZero() || c.SecretKeyFile != "") {
		errs = append(errs, errors.New("RUNLOG_S3_ACCESS_KEY: required with a secret key"))
	}
	if c.Timeout <= 0 {
		errs = append(errs, errors.New("RUNLOG_S3_TIMEOUT: must be positive"))
	}
	return errs
}

// Open returns the Store cfg selects. db is used by the postgres backend
// (the caller keeps owning it); the s3 backend checks that its bucket
// exists.
func Open(ctx context.Context, cfg Config, db *pgxpool.Pool) (Store, error) {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	switch cfg.Backend {
	case BackendPostgres, "":
		if db == nil {
			return nil, errors.New("run logs: the postgres backend needs a database")
		}
		return NewPostgres(db, cfg.MaxBytes), nil
	case BackendDir:
		return NewDir(cfg.Dir, cfg.MaxBytes)
	case BackendS3:
		secret := cfg.S3.SecretKey.Reveal()
		if cfg.S3.SecretKeyFile != "" {
			b, err := os.ReadFile(cfg.S3.SecretKeyFile)
			if err != nil {
				return nil, fmt.Errorf("run logs: read RUNLOG_S3_SECRET_KEY_FILE: %w", err)
			}
			secret = strings.TrimSpace(string(b))
		}
		return NewS3(ctx, S3Options{
			Endpoint: cfg.S3.Endpoint, Bucket: cfg.S3.Bucket, Prefix: cfg.S3.Prefix, Region: cfg.S3.Region,
			AccessKey: cfg.S3.AccessKey, SecretKey: secret, PathStyle: cfg.S3.PathStyle,
			Timeout: cfg.S3.Timeout, MaxBytes: cfg.MaxBytes,
		})
	}
	return nil, fmt.Errorf("run logs: unknown backend %q", cfg.Backend)
}
