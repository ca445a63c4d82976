package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestAPIServesTLS: with API_TLS_CERT_FILE and API_TLS_KEY_FILE the real
// binary's API answers over HTTPS with that certificate (a client
// trusting it connects, a plain HTTP request is not served); one of the
// two alone is a configuration error (exit 2 naming the missing one).
func TestAPIServesTLS(t *testing.T) {
	bin := testenv.BuildBinary(t, ".")
	certPEM, certFile, keyFile := selfSignedCert(t)

	for _, tt := range []struct{ set, missing string }{
		{"API_TLS_CERT_FILE=" + certFile, "API_TLS_KEY_FILE"},
		{"API_TLS_KEY_FILE=" + keyFile, "API_TLS_CERT_FILE"},
	} {
		_, stderr, code := testenv.RunBinary(t, bin, testenv.BinaryEnv(tt.set), "--check-config")
		if code != 2 || !strings.Contains(stderr, tt.missing+": required with") {
			t.Errorf("%s alone: exit %d, stderr:\n%s", tt.set, code, stderr)
		}
		if strings.Contains(stderr, "PRIVATE KEY") {
			t.Errorf("the key is in the error:\n%s", stderr)
		}
	}

	api := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	p := testenv.StartBinary(t, bin, testenv.BinaryEnv("DATABASE_URL="+testenv.Postgres(t), "REDIS_URL="+testenv.RedisURL(t),
		"API_ADDR="+api, "ADMIN_ADDR="+admin, "LOG_FORMAT=json", "API_TLS_CERT_FILE="+certFile, "API_TLS_KEY_FILE="+keyFile))
	if ready := p.WaitHTTP("http://"+admin+"/readyz", 200, time.Minute); !strings.Contains(ready, `"api":{"ok":true`) {
		t.Errorf("/readyz is ready without the API's check: %s", ready)
	}

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certPEM)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	resp, err := client.Get("https://" + api + "/api/v1/openapi.json")
	if err != nil {
		t.Fatalf("HTTPS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 ||
		resp.TLS.PeerCertificates[0].Subject.CommonName != "deployer-test" {
		t.Fatalf("HTTPS answer %d, TLS %+v", resp.StatusCode, resp.TLS)
	}
	if resp, err := http.Get("http://" + api + "/api/v1/openapi.json"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("the API answered plain HTTP with TLS configured")
		}
	}
	if !strings.Contains(p.Stderr(), `"tls":true`) {
		t.Errorf("the API did not log that it serves TLS:\n%s", p.Stderr())
	}
}

// selfSignedCert writes a self-signed certificate for 127.0.0.1 and its key
// to files and returns the certificate's PEM and the two paths.
func selfSignedCert(t *testing.T) (certPEM []byte, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "deployer-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	certFile, keyFile = filepath.Join(dir, "api.crt"), filepath.Join(dir, "api.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPEM, certFile, keyFile
}
