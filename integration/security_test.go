package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHTTPAPIBeyondLoopbackNeedsAdmins: as Apache CouchDB 3, a node whose
// HTTP API other machines could reach refuses to start without [admins],
// saying what to set; allow_admin_party = true lets it start anyway.
func TestHTTPAPIBeyondLoopbackNeedsAdmins(t *testing.T) {
	skipShort(t)
	res := runCmd(t, filepath.Join(binDir, "couchrepd"), "--data", t.TempDir(), "--admin", "127.0.0.1:0", "--http", "0.0.0.0:0")
	if res.code == 0 || !strings.Contains(res.stderr, "[admins]") || !strings.Contains(res.stderr, "allow_admin_party = true") {
		t.Fatalf("couchrepd --http 0.0.0.0:0 without admins: exit %d, stderr %q; want a refusal naming [admins] and allow_admin_party", res.code, res.stderr)
	}
	cfg := filepath.Join(t.TempDir(), "party.ini")
	if err := os.WriteFile(cfg, []byte("[couchrep]\nallow_admin_party = true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, nodeOptions{config: cfg, extra: []string{"--http", "0.0.0.0:0"}})
	_, port, _ := net.SplitHostPort(n.httpAddr(""))
	if r := api(t, "127.0.0.1:"+port, "GET", "/_scheduler/jobs", ""); r.status != 200 {
		t.Fatalf("admin party: %d %s", r.status, r.body)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key (PEM) into dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "couchrep test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestHTTPAPISecurityDefaults: plain [admins] passwords are replaced in the
// config file by CouchDB's pbkdf2 hash on start (comments kept) and still
// log in; [ssl] serves the API over TLS only.
func TestHTTPAPISecurityDefaults(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	cfg := filepath.Join(dir, "local.ini")
	ini := "; operator's notes stay\n[ssl]\nenable = true\ncert_file = " + certFile + "\nkey_file = " + keyFile +
		"\n\n[admins]\n; the on-call admin\nops = correct horse ; rotate yearly\n"
	if err := os.WriteFile(cfg, []byte(ini), 0o600); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, nodeOptions{config: cfg})
	addr := n.httpAddr("")

	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	if strings.Contains(text, "correct horse") || !strings.Contains(text, "ops = -pbkdf2-") ||
		!strings.Contains(text, "; operator's notes stay\n") || !strings.Contains(text, "; the on-call admin\n") || !strings.Contains(text, " ; rotate yearly\n") {
		t.Fatalf("config file after the first start:\n%s", text)
	}
	if strings.Contains(n.logs.String(), "correct horse") {
		t.Fatal("the admin password is in the node's logs")
	}

	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	get := func(user, pass string) int {
		req, _ := http.NewRequest("GET", "https://"+addr+"/_scheduler/jobs", nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET over TLS: %v", err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if s := get("ops", "correct horse"); s != 200 {
		t.Fatalf("login with the hashed password over TLS: %d", s)
	}
	if s := get("ops", "wrong"); s != 401 {
		t.Fatalf("wrong password over TLS: %d", s)
	}
	if resp, err := http.Get("http://" + addr + "/_up"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP answered 200 with [ssl] enable = true")
		}
	}
}
