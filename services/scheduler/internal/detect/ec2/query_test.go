package ec2

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestRepeatedNextTokenEndsTheListing: an endpoint that hands back a token
// it gave before (a broken proxy, a bug) ends the listing instead of paging
// forever; a network error is retried.
func TestRepeatedNextTokenEndsTheListing(t *testing.T) {
	var calls atomic.Int32
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if n == 1 { // drop the first connection: a network error
			hj, _ := w.(http.Hijacker)
			conn, _, err := hj.Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), "Action=DescribeInstances") || r.Header.Get("Authorization") == "" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/xml")
		_, _ = io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>r</requestId>
<reservationSet><item><instancesSet><item><instanceId>i-1</instanceId><instanceType>t3.micro</instanceType>
<ipAddress>203.0.113.9</ipAddress><tagSet><item><key>env</key><value>prod</value></item></tagSet></item></instancesSet></item></reservationSet>
<nextToken>same</nextToken></DescribeInstancesResponse>`)
	}))
	defer hs.Close()
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	d, err := New(t.Context(), Config{Region: region, Endpoint: hs.URL, AccessKeyID: akid, SecretAccessKey: secret})
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.Detect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// Page 1 (after the retried network error) and page 2 (token "same"),
	// then the repeated token ends it.
	if len(got) != 2 || got[0].Handle != "i-1" || got[0].Labels["env"] != "prod" || calls.Load() != 3 {
		t.Errorf("detected %+v after %d calls", got, calls.Load())
	}
}
