package testserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a throw-away certificate authority with certificates made for one
// test run (crypto/x509, ECDSA P-256), written as PEM files into a
// temporary directory.
type PKI struct {
	// Dir holds the files.
	Dir string
	// CAFile is the CA's certificate: trust it to verify ServerCert.
	CAFile string
	// OtherCAFile is a second, unrelated CA: trusting only it makes
	// ServerCert's authority unknown.
	OtherCAFile string
	// ServerCert and ServerKey are valid for 127.0.0.1 and localhost.
	ServerCert, ServerKey string
	// ExpiredCert and ExpiredKey are valid for 127.0.0.1 but expired.
	ExpiredCert, ExpiredKey string
	// WrongHostCert and WrongHostKey are valid only for db.example.
	WrongHostCert, WrongHostKey string
	// DeepCert and DeepKey are signed through two intermediate CAs
	// (DeepChain holds the leaf and both intermediates, for a server).
	DeepCert, DeepKey, DeepChain string
	// ClientCert is a client certificate (ExtKeyUsageClientAuth);
	// ClientKey its key unencrypted, ClientKeyEncrypted the same key
	// encrypted (legacy PEM encryption) with ClientKeyPassword.
	ClientCert, ClientKey, ClientKeyEncrypted, ClientKeyPassword string
}

type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewPKI makes a fresh CA and certificates in t.TempDir().
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	dir := t.TempDir()
	p := &PKI{Dir: dir, ClientKeyPassword: "s3cret-key-pass"}
	w := func(name string, blocks ...*pem.Block) string {
		path := filepath.Join(dir, name)
		var b []byte
		for _, bl := range blocks {
			b = append(b, pem.EncodeToMemory(bl)...)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	now := time.Now()
	ca := newIssuer(t, nil, "couchrep test CA", now, true, nil, false)
	other := newIssuer(t, nil, "couchrep other CA", now, true, nil, false)
	p.CAFile = w("ca.pem", certBlock(ca.cert))
	p.OtherCAFile = w("other-ca.pem", certBlock(other.cert))

	leaf := func(name string, iss *issuer, notBefore time.Time, dnsIPs []string, client bool) (*issuer, *pem.Block) {
		l := newIssuer(t, iss, name, notBefore, false, dnsIPs, client)
		der, err := x509.MarshalECPrivateKey(l.key)
		if err != nil {
			t.Fatal(err)
		}
		return l, &pem.Block{Type: "EC PRIVATE KEY", Bytes: der}
	}
	srv, srvKey := leaf("127.0.0.1", ca, now, []string{"127.0.0.1", "localhost"}, false)
	p.ServerCert, p.ServerKey = w("server.pem", certBlock(srv.cert)), w("server-key.pem", srvKey)
	exp, expKey := leaf("expired", ca, now.Add(-48*time.Hour), []string{"127.0.0.1", "localhost"}, false)
	p.ExpiredCert, p.ExpiredKey = w("expired.pem", certBlock(exp.cert)), w("expired-key.pem", expKey)
	wrong, wrongKey := leaf("db.example", ca, now, []string{"db.example"}, false)
	p.WrongHostCert, p.WrongHostKey = w("wrong.pem", certBlock(wrong.cert)), w("wrong-key.pem", wrongKey)
	int1 := newIssuer(t, ca, "intermediate 1", now, true, nil, false)
	int2 := newIssuer(t, int1, "intermediate 2", now, true, nil, false)
	deep, deepKey := leaf("deep", int2, now, []string{"127.0.0.1", "localhost"}, false)
	p.DeepCert, p.DeepKey = w("deep.pem", certBlock(deep.cert)), w("deep-key.pem", deepKey)
	p.DeepChain = w("deep-chain.pem", certBlock(deep.cert), certBlock(int2.cert), certBlock(int1.cert))
	cl, clKey := leaf("replicator client", ca, now, nil, true)
	p.ClientCert, p.ClientKey = w("client.pem", certBlock(cl.cert)), w("client-key.pem", clKey)
	//nolint:staticcheck // legacy PEM encryption: what CouchDB's `password` decrypts and Go can too
	enc, err := x509.EncryptPEMBlock(rand.Reader, clKey.Type, clKey.Bytes, []byte(p.ClientKeyPassword), x509.PEMCipherAES256)
	if err != nil {
		t.Fatal(err)
	}
	p.ClientKeyEncrypted = w("client-key-encrypted.pem", enc)
	return p
}

func certBlock(c *x509.Certificate) *pem.Block { return &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw} }

var serial int64

// newIssuer makes a key and a certificate signed by parent (self-signed
// when nil), valid from notBefore for a day.
func newIssuer(t testing.TB, parent *issuer, cn string, notBefore time.Time, isCA bool, names []string, client bool) *issuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano() + serial),
		Subject:               pkix.Name{CommonName: cn, Organization: []string{"couchrep tests"}},
		NotBefore:             notBefore.Add(-time.Hour),
		NotAfter:              notBefore.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  isCA,
	}
	if isCA {
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	} else if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	if notBefore.Before(time.Now().Add(-24 * time.Hour)) {
		tmpl.NotAfter = notBefore.Add(time.Hour) // already expired
	}
	parentCert, parentKey := tmpl, key
	if parent != nil {
		parentCert, parentKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parentCert, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &issuer{cert: c, key: key}
}

func loadPool(caFile string) (*x509.CertPool, error) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("testserver: no certificate in %s", caFile)
	}
	return pool, nil
}
