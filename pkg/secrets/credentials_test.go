package secrets

import (
	"strings"
	"testing"
)

func TestRedactCredentials(t *testing.T) {
	t.Parallel()
	const pw = "S3cr3t-pw"
	for _, tc := range []struct{ in, want string }{
		{"postgres://autoprov:" + pw + "@127.0.0.1:5432/autoprov?sslmode=disable", "postgres://autoprov:xxxxx@127.0.0.1:5432/autoprov?sslmode=disable"},
		{"postgres://autoprov@127.0.0.1/autoprov?sslmode=disable&password=" + pw, "postgres://autoprov@127.0.0.1/autoprov?password=xxxxx&sslmode=disable"},
		{"postgres://h/db?sslpassword=" + pw + "&sslkey=/k", "postgres://h/db?sslkey=%2Fk&sslpassword=xxxxx"},
		{"redis://:" + pw + "@127.0.0.1:6379/0", "redis://:xxxxx@127.0.0.1:6379/0"},
		{"rediss://infra:" + pw + "@redis:6380/0?dial_timeout=5s", "rediss://infra:xxxxx@redis:6380/0?dial_timeout=5s"},
		{"https://" + pw + "@github.com/acme/shop.git", "https://xxxxx@github.com/acme/shop.git"},
		{"https://vault.example:8200/v1/x?token=" + pw, "https://vault.example:8200/v1/x?token=xxxxx"},
		{"postgres://u:" + pw + "@h:badport/db", "postgres://xxxxx@h:badport/db"},
		{"host=db port=5432 user=autoprov password=" + pw + " dbname=x", "host=db port=5432 user=autoprov password=xxxxx dbname=x"},
		{"host=db password='" + pw + " with space' user=u", "host=db password=xxxxx user=u"},
		{"host=db PASSWORD = " + pw, "host=db PASSWORD = xxxxx"},
		{"postgres://autoprov@127.0.0.1:15432/autoprov?sslmode=disable", "postgres://autoprov@127.0.0.1:15432/autoprov?sslmode=disable"},
		{"redis://127.0.0.1:16379/0", "redis://127.0.0.1:16379/0"},
		{"https://billing.time4vps.com/api", "https://billing.time4vps.com/api"},
		{"deploy_project.yml:20m/5m", "deploy_project.yml:20m/5m"},
		{"info", "info"},
	} {
		got := RedactCredentials(tc.in)
		if got != tc.want {
			t.Errorf("RedactCredentials(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, pw) {
			t.Errorf("%q: the password survived", tc.in)
		}
	}
}
