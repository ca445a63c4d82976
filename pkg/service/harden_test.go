package service

import "testing"

// TestScrubbedVars: the variables Main removes from the environment block
// are the secret fields, those tagged scrub:"true" (the URLs holding
// passwords) and those starting with a scrub:"prefix" field's value.
func TestScrubbedVars(t *testing.T) {
	type cfgT struct {
		Common
		Token  string `env:"API_TOKEN" secret:"true"`
		Prefix string `env:"SECRET_PREFIX" scrub:"prefix"`
		Empty  string `env:"OTHER_PREFIX" scrub:"prefix"`
		Plain  string `env:"PLAIN"`
	}
	cfg := &cfgT{Prefix: "MY_SECRET_"}
	match := ScrubbedVars(cfg)
	for name, want := range map[string]bool{
		"API_TOKEN": true, "DATABASE_URL": true, "REDIS_URL": true, "REDIS_SENTINEL_PASSWORD": true,
		"MY_SECRET_X": true, "PLAIN": false, "SECRET_PREFIX": false, "OTHER_PREFIX": false,
		"DATABASE_URL_FILE": false, "LOG_LEVEL": false, "PATH": false,
		"PGPASSWORD": true, "AWS_SECRET_ACCESS_KEY": true, "AWS_SESSION_TOKEN": true, "AWS_ACCESS_KEY_ID": false,
	} {
		if got := match(name); got != want {
			t.Errorf("%s scrubbed: %v, want %v", name, got, want)
		}
	}
}
