// Package ec2test is a stand-in of the Amazon EC2 Query API's
// DescribeInstances, built from AWS's public API reference (EC2 API
// Reference: DescribeInstances, Filtering, Pagination, Error codes, Query
// requests and Signature Version 4), for tests of the EC2 detector through
// the real aws-sdk-go-v2 client.
//
// What it implements, as documented:
//
//   - POST / with a form body: Action=DescribeInstances, Version=2016-11-15,
//     Filter.N.Name / Filter.N.Value.M, InstanceId.N, MaxResults (5 to 1000,
//     not with InstanceId), NextToken; other actions answer
//     InvalidAction.
//   - Filters: tag:<key>, tag-key, instance-state-name, instance-id,
//     instance-type, availability-zone; values of one filter are ORed,
//     filters are ANDed; '*' and '?' are wildcards. An unknown filter name is
//     InvalidParameterValue.
//   - The response: DescribeInstancesResponse with requestId, reservationSet
//     (reservationId, ownerId, instancesSet: instanceId, imageId,
//     instanceState (code, name), privateDnsName, dnsName, instanceType,
//     placement/availabilityZone, privateIpAddress, ipAddress, tagSet) and
//     nextToken while more results remain.
//   - Errors: the documented body <Response><Errors><Error><Code/><Message/>
//     </Error></Errors><RequestID/></Response> with HTTP 400 (client
//     errors), 401/403 (AuthFailure), 503 (Unavailable, RequestLimitExceeded).
//   - Authentication: Signature Version 4. The Authorization header must
//     name a known access key, the region and service ec2, and its signature
//     must match the one computed again from the request with the secret key
//     (aws-sdk-go-v2's signer, so the check is the real algorithm).
package ec2test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// APIVersion is the EC2 API version the stand-in speaks.
const APIVersion = "2016-11-15"

// Instance is an instance of the stand-in.
type Instance struct {
	ID               string
	ImageID          string
	State            string // pending, running, stopping, stopped, shutting-down, terminated; default running
	Type             string // default t3.micro
	AvailabilityZone string // default <region>a
	PrivateIP        string
	PublicIP         string
	PrivateDNS       string
	PublicDNS        string
	Tags             map[string]string
	ReservationID    string // default: one reservation per instance
}

var stateCodes = map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}

// Server is the stand-in.
type Server struct {
	hs     *httptest.Server
	region string
	keys   map[string]string // access key id -> secret

	mu        sync.Mutex
	instances []Instance
	// unsorted: instances were added since they were last sorted by id.
	unsorted bool
	fail     []fault
	requests []url.Values
	// tokens: next token -> the listing it pages through (the instances
	// that matched at its first page, as EC2's pagination sees them) and
	// where the next page starts in it.
	tokens map[string]cursor
	delay  time.Duration
}

type fault struct {
	status int
	code   string
	msg    string
}

// New starts a stand-in for region accepting the access key id with its
// secret. Close it when done.
func New(region, accessKeyID, secretKey string) *Server {
	s := &Server{region: region, keys: map[string]string{accessKeyID: secretKey}, tokens: map[string]cursor{}}
	s.hs = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// URL is the endpoint to give the SDK (BaseEndpoint).
func (s *Server) URL() string { return s.hs.URL }

// Close stops the server.
func (s *Server) Close() { s.hs.Close() }

// Add adds instances.
func (s *Server) Add(in ...Instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, i := range in {
		if i.State == "" {
			i.State = "running"
		}
		if i.Type == "" {
			i.Type = "t3.micro"
		}
		if i.AvailabilityZone == "" {
			i.AvailabilityZone = s.region + "a"
		}
		if i.ImageID == "" {
			i.ImageID = "ami-0123456789abcdef0"
		}
		if i.ReservationID == "" {
			i.ReservationID = "r-" + strings.TrimPrefix(i.ID, "i-")
		}
		s.instances = append(s.instances, i)
		s.unsorted = true
	}
}

// Remove removes the instance with id (as if terminated long ago).
func (s *Server) Remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, in := range s.instances {
		if in.ID == id {
			s.instances = append(s.instances[:i], s.instances[i+1:]...)
			return
		}
	}
}

// FailNext makes the next n requests fail with the HTTP status and the
// error code (e.g. 503 "Unavailable", 503 "RequestLimitExceeded").
func (s *Server) FailNext(n, status int, code, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.fail = append(s.fail, fault{status, code, message})
	}
}

// SetDelay makes every later request wait d before it is answered (a slow
// provider, a long listing).
func (s *Server) SetDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

// Requests returns the form values of the requests served so far.
func (s *Server) Requests() []url.Values {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]url.Values(nil), s.requests...)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, "MalformedQueryString", "cannot read the request body")
		return
	}
	if r.Method != http.MethodPost || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		writeError(w, http.StatusBadRequest, "InvalidAction", "requests must be POST with a form body")
		return
	}
	if code, msg := s.authenticate(r, body); code != "" {
		writeError(w, http.StatusUnauthorized, code, msg)
		return
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		writeError(w, http.StatusBadRequest, "MalformedQueryString", err.Error())
		return
	}
	s.mu.Lock()
	s.requests = append(s.requests, form)
	var f *fault
	if len(s.fail) > 0 {
		f = &s.fail[0]
		s.fail = s.fail[1:]
	}
	delay := s.delay
	s.mu.Unlock()
	select {
	case <-time.After(delay):
	case <-r.Context().Done():
		return
	}
	if f != nil {
		writeError(w, f.status, f.code, f.msg)
		return
	}
	if a := form.Get("Action"); a != "DescribeInstances" {
		writeError(w, http.StatusBadRequest, "InvalidAction", fmt.Sprintf("The action %s is not valid for this web service.", a))
		return
	}
	if v := form.Get("Version"); v != APIVersion {
		writeError(w, http.StatusBadRequest, "InvalidParameterValue", fmt.Sprintf("Unsupported API version %q", v))
		return
	}
	s.describeInstances(w, form)
}

// authenticate checks the Signature Version 4 Authorization header.
func (s *Server) authenticate(r *http.Request, body []byte) (code, msg string) {
	auth := r.Header.Get("Authorization")
	const algo = "AWS4-HMAC-SHA256 "
	if !strings.HasPrefix(auth, algo) {
		return "AuthFailure", "AWS was not able to validate the provided access credentials"
	}
	parts := map[string]string{}
	for _, p := range strings.Split(strings.TrimPrefix(auth, algo), ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		parts[k] = v
	}
	scope := strings.Split(parts["Credential"], "/") // AKID/date/region/service/aws4_request
	if len(scope) != 5 || scope[4] != "aws4_request" {
		return "AuthFailure", "AWS was not able to validate the provided access credentials"
	}
	secret, ok := s.keys[scope[0]]
	if !ok {
		return "AuthFailure", "AWS was not able to validate the provided access credentials"
	}
	if scope[2] != s.region || scope[3] != "ec2" {
		return "AuthFailure", fmt.Sprintf("Credential should be scoped to a valid region (%s) and service ec2", s.region)
	}
	when, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return "AuthFailure", "missing or malformed X-Amz-Date"
	}
	if d := time.Since(when); d > 15*time.Minute || d < -15*time.Minute {
		return "AuthFailure", "Signature expired"
	}
	// Sign the same request again (same signed headers, time and body) and
	// compare.
	signed := strings.Split(parts["SignedHeaders"], ";")
	clone, _ := http.NewRequest(r.Method, "http://"+r.Host+r.URL.RequestURI(), strings.NewReader(string(body)))
	for _, h := range signed {
		if h == "host" {
			continue
		}
		for _, v := range r.Header.Values(h) {
			clone.Header.Add(h, v)
		}
	}
	clone.Host = r.Host
	sum := sha256.Sum256(body)
	err = v4.NewSigner().SignHTTP(r.Context(), aws.Credentials{AccessKeyID: scope[0], SecretAccessKey: secret},
		clone, hex.EncodeToString(sum[:]), "ec2", s.region, when)
	if err != nil {
		return "AuthFailure", err.Error()
	}
	if clone.Header.Get("Authorization") != auth {
		return "AuthFailure", "The request signature we calculated does not match the signature you provided."
	}
	return "", ""
}

type filter struct {
	name   string
	values []string
}

func (s *Server) describeInstances(w http.ResponseWriter, form url.Values) {
	var filters []filter
	for n := 1; ; n++ {
		name := form.Get(fmt.Sprintf("Filter.%d.Name", n))
		if name == "" {
			break
		}
		f := filter{name: name}
		for m := 1; ; m++ {
			v, ok := form[fmt.Sprintf("Filter.%d.Value.%d", n, m)]
			if !ok {
				break
			}
			f.values = append(f.values, v[0])
		}
		switch {
		case strings.HasPrefix(name, "tag:"), name == "tag-key", name == "instance-state-name", name == "instance-id",
			name == "instance-type", name == "availability-zone":
		default:
			writeError(w, http.StatusBadRequest, "InvalidParameterValue", fmt.Sprintf("The filter '%s' is invalid", name))
			return
		}
		filters = append(filters, f)
	}
	var ids []string
	for n := 1; ; n++ {
		v := form.Get(fmt.Sprintf("InstanceId.%d", n))
		if v == "" {
			break
		}
		ids = append(ids, v)
	}
	maxResults := 0
	if v := form.Get("MaxResults"); v != "" {
		n, err := strconv.Atoi(v)
		switch {
		case err != nil || n < 5 || n > 1000:
			writeError(w, http.StatusBadRequest, "InvalidParameterValue",
				fmt.Sprintf("Value ( %s ) for parameter maxResults is invalid. Expecting a value between 5 and 1000.", v))
			return
		case len(ids) > 0:
			writeError(w, http.StatusBadRequest, "InvalidParameterCombination",
				"The parameter instancesSet cannot be used with the parameter maxResults")
			return
		}
		maxResults = n
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	offset := 0
	var match []Instance
	if tok := form.Get("NextToken"); tok != "" {
		c, ok := s.tokens[tok]
		if !ok {
			writeError(w, http.StatusBadRequest, "InvalidPaginationToken", "The specified pagination token is not valid or is expired.")
			return
		}
		match, offset = c.match, c.offset
	} else {
		var missing string
		if match, missing = s.matching(ids, filters); missing != "" {
			writeError(w, http.StatusBadRequest, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", missing))
			return
		}
	}
	if offset > len(match) {
		offset = len(match)
	}
	page := match[offset:]
	next := ""
	if maxResults > 0 && len(page) > maxResults {
		page = page[:maxResults]
		next = newToken()
		s.tokens[next] = cursor{match: match, offset: offset + maxResults}
	}
	writeXML(w, s.response(page, next))
}

// matching returns the instances with one of ids (any, when none) that
// match filters, in id order, or the first of ids that does not exist.
// Instances are kept in id order, sorted once after adds, and a listing
// is matched once, at its first page: a page of a million instances costs
// its page. The caller holds s.mu.
func (s *Server) matching(ids []string, filters []filter) (match []Instance, missing string) {
	if s.unsorted {
		sort.SliceStable(s.instances, func(i, j int) bool { return s.instances[i].ID < s.instances[j].ID })
		s.unsorted = false
	}
	known := map[string]bool{}
	for _, in := range s.instances {
		if len(ids) > 0 {
			known[in.ID] = true
		}
		if (len(ids) == 0 || contains(ids, in.ID)) && matches(in, filters) {
			match = append(match, in)
		}
	}
	for _, id := range ids {
		if !known[id] {
			return nil, id
		}
	}
	return match, ""
}

// cursor is where a paginated listing is (Server.tokens).
type cursor struct {
	match  []Instance
	offset int
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func matches(in Instance, filters []filter) bool {
	for _, f := range filters {
		var got []string
		switch {
		case strings.HasPrefix(f.name, "tag:"):
			v, ok := in.Tags[strings.TrimPrefix(f.name, "tag:")]
			if !ok {
				return false
			}
			got = []string{v}
		case f.name == "tag-key":
			for k := range in.Tags {
				got = append(got, k)
			}
		case f.name == "instance-state-name":
			got = []string{in.State}
		case f.name == "instance-id":
			got = []string{in.ID}
		case f.name == "instance-type":
			got = []string{in.Type}
		case f.name == "availability-zone":
			got = []string{in.AvailabilityZone}
		}
		if !anyMatch(f.values, got) {
			return false
		}
	}
	return true
}

func anyMatch(patterns, values []string) bool {
	for _, p := range patterns {
		for _, v := range values {
			if ok, _ := path.Match(p, v); ok {
				return true
			}
		}
	}
	return false
}

func newToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

// The response documents, as in the API reference's examples.
type (
	describeResponse struct {
		XMLName      xml.Name      `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ DescribeInstancesResponse"`
		RequestID    string        `xml:"requestId"`
		Reservations []reservation `xml:"reservationSet>item"`
		NextToken    string        `xml:"nextToken,omitempty"`
	}
	reservation struct {
		ReservationID string     `xml:"reservationId"`
		OwnerID       string     `xml:"ownerId"`
		Instances     []instance `xml:"instancesSet>item"`
	}
	instance struct {
		InstanceID       string `xml:"instanceId"`
		ImageID          string `xml:"imageId"`
		StateCode        int    `xml:"instanceState>code"`
		StateName        string `xml:"instanceState>name"`
		PrivateDNSName   string `xml:"privateDnsName"`
		DNSName          string `xml:"dnsName"`
		InstanceType     string `xml:"instanceType"`
		AvailabilityZone string `xml:"placement>availabilityZone"`
		PrivateIP        string `xml:"privateIpAddress,omitempty"`
		PublicIP         string `xml:"ipAddress,omitempty"`
		Tags             []tag  `xml:"tagSet>item"`
	}
	tag struct {
		Key   string `xml:"key"`
		Value string `xml:"value"`
	}
	errorResponse struct {
		XMLName   xml.Name   `xml:"Response"`
		Errors    []apiError `xml:"Errors>Error"`
		RequestID string     `xml:"RequestID"`
	}
	apiError struct {
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	}
)

func (s *Server) response(page []Instance, next string) describeResponse {
	resp := describeResponse{RequestID: requestID(), NextToken: next}
	byRes := map[string]int{}
	for _, in := range page {
		i, ok := byRes[in.ReservationID]
		if !ok {
			i = len(resp.Reservations)
			byRes[in.ReservationID] = i
			resp.Reservations = append(resp.Reservations, reservation{ReservationID: in.ReservationID, OwnerID: "123456789012"})
		}
		x := instance{InstanceID: in.ID, ImageID: in.ImageID, StateCode: stateCodes[in.State], StateName: in.State,
			PrivateDNSName: in.PrivateDNS, DNSName: in.PublicDNS, InstanceType: in.Type, AvailabilityZone: in.AvailabilityZone,
			PrivateIP: in.PrivateIP, PublicIP: in.PublicIP}
		keys := make([]string, 0, len(in.Tags))
		for k := range in.Tags {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			x.Tags = append(x.Tags, tag{Key: k, Value: in.Tags[k]})
		}
		resp.Reservations[i].Instances = append(resp.Reservations[i].Instances, x)
	}
	return resp
}

func requestID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func writeXML(w http.ResponseWriter, v any) {
	out, err := xml.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	_, _ = io.WriteString(w, xml.Header)
	_, _ = w.Write(out)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	out, _ := xml.Marshal(errorResponse{Errors: []apiError{{Code: code, Message: msg}}, RequestID: requestID()})
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, xml.Header)
	_, _ = w.Write(out)
}
