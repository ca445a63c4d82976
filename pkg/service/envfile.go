package service

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/joho/godotenv"
)

// EnvFileVar names the variable that points the operators' tools
// (autoprov, `deployer keys`) at an env file of settings.
const EnvFileVar = "AUTOPROV_ENV_FILE"

// DefaultEnvFile is the env file `make run` writes with the settings it
// starts the services with; the operators' tools read it, relative to the
// working directory, when it exists and neither a flag nor
// AUTOPROV_ENV_FILE names another (AUTOPROV_ENV_FILE=/dev/null: none).
const DefaultEnvFile = "run/dev/autoprov.env"

// FindEnvFile returns the env file an operators' tool reads: explicit (its
// --env-file) when set, else $AUTOPROV_ENV_FILE (which must exist), else
// DefaultEnvFile when it exists; "" when there is none.
func FindEnvFile(explicit string, getenv func(string) string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if p := getenv(EnvFileVar); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s: %w", EnvFileVar, err)
		}
		return p, nil
	}
	if st, err := os.Stat(DefaultEnvFile); err == nil && !st.IsDir() {
		return DefaultEnvFile, nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("env file %s: %w", DefaultEnvFile, err)
	}
	return "", nil
}

// ReadEnvFile reads a dotenv file (KEY=value lines, as docker compose's
// env_file and systemd's EnvironmentFile hold them).
func ReadEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("env file: %w", err)
	}
	defer f.Close()
	m, err := godotenv.Parse(f)
	if err != nil {
		return nil, fmt.Errorf("env file %s: %w", path, err)
	}
	return m, nil
}

// WithEnvFile returns a getenv that reads getenv first, then file's
// variables. A URL set in the environment hides its _FILE form in file
// (and the other way round), so the two never meet.
func WithEnvFile(getenv func(string) string, file map[string]string) func(string) string {
	return func(name string) string {
		if v := getenv(name); v != "" {
			return v
		}
		for _, pair := range [][2]string{{"REDIS_URL", "REDIS_URL_FILE"}, {"DATABASE_URL", "DATABASE_URL_FILE"}} {
			if (name == pair[0] && getenv(pair[1]) != "") || (name == pair[1] && getenv(pair[0]) != "") {
				return ""
			}
		}
		return file[name]
	}
}
