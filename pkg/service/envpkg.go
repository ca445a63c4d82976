package service

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/joho/godotenv"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
)

// Variables that select an environment's configuration package: a folder
// $AUTOPROV_CONFIG_DIR/$AUTOPROV_ENV/ (default config/<env>/) holding
// common.env (every service) and <service>.env (one service), dotenv files
// of the same variables the services read from the environment. The
// process environment wins over the files, <service>.env over common.env.
// `autoprov validate --env NAME` checks a package before it is used.
const (
	EnvPackageVar = "AUTOPROV_ENV"
	ConfigDirVar  = "AUTOPROV_CONFIG_DIR"
)

// DefaultConfigDir is where environment packages are unless
// AUTOPROV_CONFIG_DIR says otherwise (relative to the working directory).
const DefaultConfigDir = "config"

var envNameRE = pattern.MustCompile(`^[a-z0-9][a-z0-9_-]*$`, 63)

// WithEnvPackage returns getenv completed with the environment package
// AUTOPROV_ENV names for the service name; getenv itself when AUTOPROV_ENV
// is unset. A bad name, a missing package or a file that does not parse is
// a *ConfigError naming AUTOPROV_ENV.
func WithEnvPackage(getenv func(string) string, name string) (func(string) string, error) {
	env := getenv(EnvPackageVar)
	if env == "" {
		return getenv, nil
	}
	fail := func(format string, args ...any) error {
		return &ConfigError{Problems: []error{Invalid(EnvPackageVar, format, args...)}}
	}
	if !envNameRE.MatchString(env) {
		return nil, fail("%q is not an environment name (lower-case letters, digits, - and _)", env)
	}
	dir := getenv(ConfigDirVar)
	if dir == "" {
		dir = DefaultConfigDir
	}
	pkg := filepath.Join(dir, env)
	if st, err := os.Stat(pkg); err != nil || !st.IsDir() {
		return nil, fail("no configuration package %s", pkg)
	}
	layers := make([]map[string]string, 0, 2)
	for _, file := range []string{name + ".env", "common.env"} {
		vars, err := godotenv.Read(filepath.Join(pkg, file))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return nil, fail("%s: %v", filepath.Join(pkg, file), err)
		}
		for k := range vars {
			if k == EnvPackageVar || k == ConfigDirVar {
				return nil, fail("%s sets %s: a package cannot name another", filepath.Join(pkg, file), k)
			}
		}
		layers = append(layers, vars)
	}
	return func(key string) string {
		if v := getenv(key); v != "" {
			return v
		}
		for _, l := range layers {
			if v, ok := l[key]; ok {
				return v
			}
		}
		return ""
	}, nil
}
