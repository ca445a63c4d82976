package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestDeploymentsJobIDCheck: a deployment's job id is 1 to 255 characters
// from '!' to '~' (printable ASCII without space), as the wire contract
// says; Postgres refuses anything else.
func TestDeploymentsJobIDCheck(t *testing.T) {
	t.Parallel()
	db := testenv.Pool(t)
	for _, tc := range []struct {
		name, jobID string
		ok          bool
	}{
		{"a UUID", "0193f0e4-8d4c-7b3a-9c1e-2f4a5b6c7d8e", true},
		{"a stream entry id", "1714564800000-0", true},
		{"one character", "x", true},
		{"every allowed character", "!\"#$%&'()*+,-./0123456789:;<=>?@ABCXYZ[\\]^_`abcxyz{|}~", true},
		{"255 characters", strings.Repeat("a", 255), true},
		{"empty", "", false},
		{"256 characters", strings.Repeat("a", 256), false},
		{"a space", "a b", false},
		{"a tab", "a\tb", false},
		{"a newline at the end", "abc\n", false},
		{"DEL", "a\x7fb", false},
		{"non-ASCII", "déploiement", false},
		{"254 characters and a two-byte one", strings.Repeat("a", 254) + "é", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := db.Exec(context.Background(),
				`INSERT INTO deployments (id, job_id, source) VALUES (gen_random_uuid(), $1, 'stream')`, tc.jobID)
			if (err == nil) != tc.ok {
				t.Errorf("job id %q: error %v; want accepted %v", tc.jobID, err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "deployments_job_id_check") {
				t.Errorf("job id %q refused for another reason: %v", tc.jobID, err)
			}
		})
	}
}
