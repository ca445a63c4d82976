package ec2

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/smithy-go"
)

// The EC2 Query API as the detector uses it: DescribeInstances only, a form
// POST signed with aws-sdk-go-v2's Signature Version 4 signer, the
// documented XML response and error body. It replaces the SDK's generated
// service/ec2 client, whose one package (every EC2 operation and type) took
// minutes to compile with -race on the CI machine for the single call the
// detector makes (README, Performance).

// apiVersion is the EC2 API version of the requests.
const apiVersion = "2016-11-15"

// maxResponse bounds a response body (a page of 1,000 instances is a few
// MiB).
const maxResponse = 64 << 20

// filter is one DescribeInstances filter: values ORed, filters ANDed.
type filter struct {
	Name   string
	Values []string
}

// describeInput is a DescribeInstances request.
type describeInput struct {
	Filters    []filter
	MaxResults int32 // 0: the API's default
	NextToken  string
}

// describeOutput is the part of DescribeInstancesResponse the detector
// reads.
type describeOutput struct {
	Reservations []reservation `xml:"reservationSet>item"`
	NextToken    string        `xml:"nextToken"`
}

type reservation struct {
	Instances []instance `xml:"instancesSet>item"`
}

type instance struct {
	InstanceID       string `xml:"instanceId"`
	InstanceType     string `xml:"instanceType"`
	AvailabilityZone string `xml:"placement>availabilityZone"`
	PrivateIP        string `xml:"privateIpAddress"`
	PublicIP         string `xml:"ipAddress"`
	Tags             []tag  `xml:"tagSet>item"`
}

type tag struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

// errorResponse is the documented error body.
type errorResponse struct {
	Errors []struct {
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	} `xml:"Errors>Error"`
	RequestID string `xml:"RequestID"`
}

// client calls the EC2 Query API of one region.
type client struct {
	endpoint    string
	region      string
	creds       aws.CredentialsProvider
	signer      *v4.Signer
	http        *http.Client
	maxAttempts int
}

// defaultEndpoint is the regional endpoint of EC2.
func defaultEndpoint(region string) string {
	if strings.HasPrefix(region, "cn-") {
		return "https://ec2." + region + ".amazonaws.com.cn/"
	}
	return "https://ec2." + region + ".amazonaws.com/"
}

// retryableCodes are the error codes worth another attempt (throttling and
// the service's own faults).
var retryableCodes = map[string]bool{
	"RequestLimitExceeded": true, "Throttling": true, "ThrottlingException": true, "RequestThrottled": true,
	"InternalError": true, "InternalFailure": true, "Unavailable": true, "ServiceUnavailable": true,
}

// describeInstances makes one DescribeInstances call, with up to
// maxAttempts attempts for throttling, 5xx answers and network errors
// (exponential backoff with full jitter). API errors are smithy.APIError
// values, as the SDK's.
func (c *client) describeInstances(ctx context.Context, in describeInput) (*describeOutput, error) {
	body := c.form(in)
	var err error
	for attempt := range c.maxAttempts {
		if attempt > 0 {
			wait := time.Duration(rand.Int64N(int64(min(20*time.Second, 100*time.Millisecond<<attempt))))
			select {
			case <-ctx.Done():
				return nil, errors.Join(err, ctx.Err())
			case <-time.After(wait):
			}
		}
		var out *describeOutput
		var retry bool
		out, retry, err = c.call(ctx, body)
		if err == nil {
			return out, nil
		}
		if !retry || ctx.Err() != nil {
			break
		}
	}
	return nil, err
}

// form encodes the request as the Query API's form.
func (c *client) form(in describeInput) string {
	v := url.Values{"Action": {"DescribeInstances"}, "Version": {apiVersion}}
	for i, f := range in.Filters {
		p := "Filter." + strconv.Itoa(i+1)
		v.Set(p+".Name", f.Name)
		for j, val := range f.Values {
			v.Set(p+".Value."+strconv.Itoa(j+1), val)
		}
	}
	if in.MaxResults > 0 {
		v.Set("MaxResults", strconv.Itoa(int(in.MaxResults)))
	}
	if in.NextToken != "" {
		v.Set("NextToken", in.NextToken)
	}
	return v.Encode()
}

// call makes one signed request; retry says whether another attempt may
// succeed.
func (c *client) call(ctx context.Context, body string) (out *describeOutput, retry bool, err error) {
	creds, err := c.creds.Retrieve(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("retrieve AWS credentials: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, strings.NewReader(body))
	if err != nil {
		return nil, false, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	sum := sha256.Sum256([]byte(body))
	if err := c.signer.SignHTTP(ctx, creds, req, hex.EncodeToString(sum[:]), "ec2", c.region, time.Now()); err != nil {
		return nil, false, fmt.Errorf("sign request: %w", err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, ctx.Err() == nil, err // a network error: retried
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return nil, true, fmt.Errorf("read response: %w", err)
	}
	if len(data) > maxResponse {
		return nil, false, fmt.Errorf("response larger than %d bytes", maxResponse)
	}
	if resp.StatusCode/100 != 2 {
		apiErr := &smithy.GenericAPIError{Code: http.StatusText(resp.StatusCode), Message: "HTTP " + resp.Status, Fault: smithy.FaultServer}
		var e errorResponse
		if xml.Unmarshal(data, &e) == nil && len(e.Errors) > 0 {
			apiErr.Code, apiErr.Message = e.Errors[0].Code, e.Errors[0].Message
		}
		if resp.StatusCode < 500 {
			apiErr.Fault = smithy.FaultClient
		}
		return nil, resp.StatusCode >= 500 || retryableCodes[apiErr.Code], apiErr
	}
	out = &describeOutput{}
	if err := xml.NewDecoder(bytes.NewReader(data)).Decode(out); err != nil {
		return nil, false, fmt.Errorf("decode DescribeInstancesResponse: %w", err)
	}
	return out, false, nil
}
