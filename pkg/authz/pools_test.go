package authz

import (
	"strings"
	"testing"
)

const (
	projA = "0d9b3f0e-58c6-4c1e-9a57-3b1f4c2a7e01"
	projB = "7a6f1c2d-1e0b-4f3a-8c9d-5e4b3a2f1d02"
)

func TestPoolsCheck(t *testing.T) {
	t.Parallel()
	p, err := ParsePools(" gpu=* , tenant-b=" + strings.ToUpper(projB) + ", trusted=" + projA + "|" + projB)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		pool, project string
		ok            bool
		says          string
	}{
		{"", projA, true, ""},         // the default pool is everyone's
		{"gpu", projA, true, ""},      // granted to every project
		{"tenant-b", projB, true, ""}, // granted (ids compared in canonical form)
		{"tenant-b", strings.ToUpper(projB), true, ""},
		{"trusted", projA, true, ""},
		{"tenant-b", projA, false, "may not use pool \"tenant-b\""}, // another project's pool
		{"unknown", projA, false, "JOB_POOL_PROJECTS"},              // a pool nobody was granted
		{"default", projA, false, "not a pool's name"},              // JOB_POOLS's word, not a name
		{"none", projA, false, "not a pool's name"},
		{"Bad_Name", projA, false, "must match"},
		{"gpu", "not-a-project", false, "may not use"},
	}
	for _, tt := range tests {
		err := p.Check(tt.pool, tt.project)
		if (err == nil) != tt.ok || err != nil && !strings.Contains(err.Error(), tt.says) {
			t.Errorf("Check(%q, %q) = %v, want ok=%v (saying %q)", tt.pool, tt.project, err, tt.ok, tt.says)
		}
		if err != nil && strings.Contains(err.Error(), projB) && tt.project != projB {
			t.Errorf("Check(%q, %q) names another project: %v", tt.pool, tt.project, err)
		}
	}
	if !p.Granted("gpu") || p.Granted("unknown") {
		t.Errorf("Granted: gpu %v, unknown %v", p.Granted("gpu"), p.Granted("unknown"))
	}
	// The zero value and an empty setting grant no named pool.
	for _, z := range []Pools{{}, mustPools(t, "")} {
		if z.Check("gpu", projA) == nil || z.Check("", projA) != nil {
			t.Errorf("empty grants: gpu %v, default %v", z.Check("gpu", projA), z.Check("", projA))
		}
	}
}

func TestParsePoolsRefuses(t *testing.T) {
	t.Parallel()
	for value, says := range map[string]string{
		"gpu":                       "want pool=project",
		"gpu=":                      "want pool=project",
		"default=*":                 "not a pool's name",
		"none=*":                    "not a pool's name",
		"GPU=*":                     "must match",
		"gpu=tenant-a":              "not a project id",
		"gpu=*,gpu=" + projA:        "granted twice",
		"gpu=" + projA + "|nothing": "not a project id",
	} {
		if _, err := (PoolConfig{Projects: value}).Pools(); err == nil || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), PoolsSetting) {
			t.Errorf("ParsePools(%q) = %v, want an error naming %s and saying %q", value, err, PoolsSetting, says)
		}
	}
}

func mustPools(t *testing.T, s string) Pools {
	t.Helper()
	p, err := ParsePools(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
