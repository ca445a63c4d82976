package ec2

import (
	"context"
	"errors"
	"fmt"
	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/smithy-go"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/detect/ec2/ec2test"
)

const (
	region = "eu-central-1"
	akid   = "AKIAIOSFODNN7EXAMPLE"
	secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
)

// TestMain keeps the AWS SDK off any instance metadata service and the
// user's AWS files, for every test at once: t.Setenv would keep the tests
// from running in parallel.
func TestMain(m *testing.M) {
	os.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	os.Setenv("AWS_CONFIG_FILE", "/dev/null")
	os.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
	os.Exit(m.Run())
}

func setup(t *testing.T, cfg Config) (*Detector, *ec2test.Server) {
	t.Helper()
	srv := ec2test.New(region, akid, secret)
	t.Cleanup(srv.Close)
	cfg.Region, cfg.Endpoint = region, srv.URL()
	if cfg.AccessKeyID == "" {
		cfg.AccessKeyID, cfg.SecretAccessKey = akid, secret
	}
	d, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d, srv
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// list collects what d yields.
func list(ctx context.Context, d *Detector) ([]fleet.Detected, error) {
	var out []fleet.Detected
	err := d.Detect(ctx, func(s fleet.Detected) error {
		out = append(out, s)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func TestDescribeInstancesFiltersAndPages(t *testing.T) {
	t.Parallel()
	d, srv := setup(t, Config{Tags: map[string][]string{"env": {"prod", "staging"}, "autoprov": {"*"}}, PageSize: 5})
	for i := range 12 {
		srv.Add(ec2test.Instance{ID: fmt.Sprintf("i-%017d", i), PublicIP: fmt.Sprintf("203.0.113.%d", i+1),
			PrivateIP: fmt.Sprintf("10.0.0.%d", i+1), ReservationID: fmt.Sprintf("r-%d", i/3),
			Tags: map[string]string{"env": "prod", "autoprov": "yes", "Name": fmt.Sprintf("web-%d", i), "aws:cloudformation:stack-name": "x"}})
	}
	srv.Add(
		ec2test.Instance{ID: "i-stopped", State: "stopped", PublicIP: "203.0.113.100", Tags: map[string]string{"env": "prod", "autoprov": ""}},
		ec2test.Instance{ID: "i-dev", PublicIP: "203.0.113.101", Tags: map[string]string{"env": "dev", "autoprov": ""}},
		ec2test.Instance{ID: "i-untagged", PublicIP: "203.0.113.102", Tags: map[string]string{"env": "prod"}},
		ec2test.Instance{ID: "i-private-only", PrivateIP: "10.0.1.1", Tags: map[string]string{"env": "staging", "autoprov": "", SSHUserTag: "ubuntu"}},
	)
	got, err := list(ctx(t), d)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 12 {
		t.Fatalf("detected %d instances, want the 12 running, tagged ones with a public address: %+v", len(got), got)
	}
	first := got[0]
	if first.Handle != "i-00000000000000000" || first.Address != "203.0.113.1" || first.SSHUser != "admin" ||
		first.ProviderID != first.Handle || first.Labels["Name"] != "web-0" || first.Labels["env"] != "prod" ||
		first.Labels["ec2:availability_zone"] != region+"a" || first.Labels["ec2:instance_type"] != "t3.micro" {
		t.Errorf("first: %+v", first)
	}
	if _, ok := first.Labels["aws:cloudformation:stack-name"]; ok {
		t.Error("aws: tags became labels")
	}
	reqs := srv.Requests()
	if len(reqs) != 3 {
		t.Errorf("%d requests for 12 instances at 5 a page, want 3", len(reqs))
	}
	if reqs[1].Get("NextToken") == "" || reqs[0].Get("MaxResults") != "5" {
		t.Errorf("pagination not used: %v", reqs)
	}

	// Private addresses, and the ssh user tag.
	dp, srvp := setup(t, Config{Address: "private", Tags: map[string][]string{"env": {"staging"}}})
	srvp.Add(ec2test.Instance{ID: "i-private-only", PrivateIP: "10.0.1.1", Tags: map[string]string{"env": "staging", SSHUserTag: "ubuntu"}})
	got, err = list(ctx(t), dp)
	if err != nil || len(got) != 1 || got[0].Address != "10.0.1.1" || got[0].SSHUser != "ubuntu" {
		t.Errorf("private: %+v %v", got, err)
	}
	if _, ok := got[0].Labels[SSHUserTag]; ok {
		t.Error("the ssh user tag became a label")
	}
}

// TestProjectsTag: autoprov:projects says which projects own an instance;
// without it the source says nothing (an operator decides); a tag that is
// not a list of project ids makes the instance fleet-only, never open.
func TestProjectsTag(t *testing.T) {
	t.Parallel()
	const a, b = "aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002"
	d, srv := setup(t, Config{Tags: map[string][]string{"env": {"prod"}}})
	srv.Add(
		ec2test.Instance{ID: "i-none", PublicIP: "203.0.113.11", Tags: map[string]string{"env": "prod"}},
		ec2test.Instance{ID: "i-two", PublicIP: "203.0.113.12", Tags: map[string]string{"env": "prod", ProjectsTag: b + " " + strings.ToUpper(a)}},
		ec2test.Instance{ID: "i-bad", PublicIP: "203.0.113.13", Tags: map[string]string{"env": "prod", ProjectsTag: "tenant-b"}},
	)
	got, err := list(ctx(t), d)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"i-none": nil, "i-two": {a, b}, "i-bad": {}}
	for _, det := range got {
		w := want[det.Handle]
		if (det.Projects == nil) != (w == nil) || strings.Join(det.Projects, ",") != strings.Join(w, ",") {
			t.Errorf("%s: projects %#v, want %#v", det.Handle, det.Projects, w)
		}
		if _, ok := det.Labels[ProjectsTag]; ok {
			t.Errorf("%s: the projects tag became a label", det.Handle)
		}
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	t.Run("wrong secret key: AuthFailure, no retry", func(t *testing.T) {
		t.Parallel()
		d, srv := setup(t, Config{AccessKeyID: akid, SecretAccessKey: "wrong"})
		_, err := list(ctx(t), d)
		var ae smithy.APIError
		if !errors.As(err, &ae) || ae.ErrorCode() != "AuthFailure" {
			t.Fatalf("err = %v, want AuthFailure", err)
		}
		if strings.Contains(err.Error(), "wrong") {
			t.Error("the secret key is in the error")
		}
		if n := len(srv.Requests()); n != 0 {
			t.Errorf("%d requests passed authentication", n)
		}
	})
	t.Run("unavailable: retried, then fails", func(t *testing.T) {
		t.Parallel()
		d, srv := setup(t, Config{MaxAttempts: 2})
		srv.Add(ec2test.Instance{ID: "i-1", PublicIP: "203.0.113.1"})
		srv.FailNext(2, 503, "Unavailable", "The server is overloaded and can't handle the request.")
		_, err := list(ctx(t), d)
		var ae smithy.APIError
		if !errors.As(err, &ae) || ae.ErrorCode() != "Unavailable" {
			t.Fatalf("err = %v, want Unavailable", err)
		}
		srv.FailNext(1, 503, "RequestLimitExceeded", "Request limit exceeded.")
		got, err := list(ctx(t), d)
		if err != nil || len(got) != 1 {
			t.Errorf("a throttled call is retried: %v %v", got, err)
		}
	})
	t.Run("invalid filter: InvalidParameterValue", func(t *testing.T) {
		t.Parallel()
		d, _ := setup(t, Config{})
		d.cfg.Tags = nil
		_, err := d.client.DescribeInstances(ctx(t), nil)
		if err != nil {
			t.Fatalf("no filters: %v", err)
		}
		_, err = d.client.DescribeInstances(ctx(t), bogusFilter())
		var ae smithy.APIError
		if !errors.As(err, &ae) || ae.ErrorCode() != "InvalidParameterValue" || !strings.Contains(ae.ErrorMessage(), "bogus") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("bad configuration", func(t *testing.T) {
		for _, c := range []Config{{}, {Region: region, Address: "ipv6"}, {Region: region, PageSize: 2000}} {
			if _, err := New(context.Background(), c); err == nil {
				t.Errorf("New(%+v) accepted", c)
			}
		}
	})
}

func TestParseTags(t *testing.T) {
	t.Parallel()
	got, err := ParseTags("env=prod|staging, autoprov, team=*")
	if err != nil || len(got) != 3 || got["env"][1] != "staging" || got["autoprov"][0] != "*" || got["team"][0] != "*" {
		t.Errorf("%v %v", got, err)
	}
	if _, err := ParseTags("=x"); err == nil {
		t.Error("empty key accepted")
	}
}
