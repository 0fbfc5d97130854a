package couch

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// tlsServer is an httptest TLS server presenting certFile/keyFile (a chain
// file may hold intermediates); with clientCA it requires a client
// certificate of that CA.
func tlsServer(t *testing.T, certFile, keyFile, clientCA string) *httptest.Server {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, `{"db_name":"db","update_seq":0,"instance_start_time":"0"}`)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	if clientCA != "" {
		b, err := os.ReadFile(clientCA)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(b)
		srv.TLS.ClientCAs, srv.TLS.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	srv.Config.ErrorLog = nil
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// TestNewTransportTLS runs NewTransport's TLS settings against real TLS
// servers with certificates of a fresh test CA: verification off accepts
// anything (CouchDB's default), on it names why a certificate fails, and
// the failure is final (not retried).
func TestNewTransportTLS(t *testing.T) {
	pki := testserver.NewPKI(t)
	good := tlsServer(t, pki.ServerCert, pki.ServerKey, "")
	expired := tlsServer(t, pki.ExpiredCert, pki.ExpiredKey, "")
	wrongHost := tlsServer(t, pki.WrongHostCert, pki.WrongHostKey, "")
	deep := tlsServer(t, pki.DeepChain, pki.DeepKey, "")
	mtls := tlsServer(t, pki.ServerCert, pki.ServerKey, pki.CAFile)

	verify := func(ca string, depth int) TLSOptions { return TLSOptions{Verify: true, CAFile: ca, MaxDepth: depth} }
	withClient := func(o TLSOptions, key, pass string) TLSOptions {
		o.CertFile, o.KeyFile, o.KeyPassword = pki.ClientCert, key, pass
		return o
	}
	for _, tc := range []struct {
		name    string
		srv     *httptest.Server
		tls     TLSOptions
		reason  string // "" means success
		setupOK bool   // false: NewTransport itself fails
	}{
		{"verify off accepts an unknown CA", good, TLSOptions{}, "", true},
		{"verify off accepts an expired cert", expired, TLSOptions{}, "", true},
		{"trusted CA", good, verify(pki.CAFile, 3), "", true},
		{"CA not trusted", good, verify(pki.OtherCAFile, 3), "unknown authority", true},
		{"system roots do not know the test CA", good, verify("", 3), "unknown authority", true},
		{"expired", expired, verify(pki.CAFile, 3), "expired", true},
		{"wrong host", wrongHost, verify(pki.CAFile, 3), "wrong host", true},
		{"two intermediates within depth 2", deep, verify(pki.CAFile, 2), "", true},
		{"two intermediates over depth 1", deep, verify(pki.CAFile, 1), "chain too long", true},
		{"client cert", mtls, withClient(verify(pki.CAFile, 3), pki.ClientKey, ""), "", true},
		{"encrypted client key", mtls, withClient(verify(pki.CAFile, 3), pki.ClientKeyEncrypted, pki.ClientKeyPassword), "", true},
		{"encrypted key, wrong password", mtls, withClient(verify(pki.CAFile, 3), pki.ClientKeyEncrypted, "nope"), "", false},
		{"encrypted key, no password", mtls, withClient(verify(pki.CAFile, 3), pki.ClientKeyEncrypted, ""), "", false},
		{"missing CA file", good, verify(pki.Dir+"/none.pem", 3), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := NewTransport(TransportOptions{TLS: tc.tls, ConnectTimeout: 10 * time.Second})
			if !tc.setupOK {
				if err == nil || !errors.Is(err, ErrTransportConfig) {
					t.Fatalf("NewTransport = %v, want ErrTransportConfig", err)
				}
				if tc.tls.KeyPassword != "" && strings.Contains(err.Error(), tc.tls.KeyPassword) {
					t.Fatalf("error %q shows the key password", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer tr.CloseIdleConnections()
			ep, _ := ParseEndpoint(tc.srv.URL + "/db")
			db := NewDB(ep, Options{HTTPClient: &http.Client{Transport: tr}, Retries: 3, RetryBackoff: time.Millisecond})
			_, err = db.Info(context.Background())
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("Info = %v, want success", err)
				}
				return
			}
			var ce *CertificateError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCertificate) || ce.Reason != tc.reason {
				t.Fatalf("Info = %v, want a certificate error %q", err, tc.reason)
			}
			if !strings.Contains(err.Error(), tc.srv.URL+"/db/") || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("error %q does not name the endpoint and the reason", err)
			}
		})
	}
}

// TestClientCertRequired: a server that requires a client certificate
// refuses a transport without one.
func TestClientCertRequired(t *testing.T) {
	pki := testserver.NewPKI(t)
	mtls := tlsServer(t, pki.ServerCert, pki.ServerKey, pki.CAFile)
	tr, err := NewTransport(TransportOptions{TLS: TLSOptions{Verify: true, CAFile: pki.CAFile}})
	if err != nil {
		t.Fatal(err)
	}
	ep, _ := ParseEndpoint(mtls.URL + "/db")
	_, err = NewDB(ep, Options{HTTPClient: &http.Client{Transport: tr}}).Info(context.Background())
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Info without a client certificate = %v, want a TLS certificate error", err)
	}
}

func TestParseSocketOptions(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		in   string
		want SocketOptions
	}{
		{"[{keepalive, true}, {nodelay, false}]", SocketOptions{KeepAlive: &yes, NoDelay: &no}},
		{"[{nodelay,true},{sndbuf,65536},{recbuf, 131072},{priority,6}]", SocketOptions{NoDelay: &yes, SndBuf: 65536, RecBuf: 131072}},
		{"[{keepalive, maybe}]", SocketOptions{}},
		{"not a list", SocketOptions{}},
		{"", SocketOptions{}},
	} {
		got := ParseSocketOptions(tc.in)
		if boolPtr(got.KeepAlive) != boolPtr(tc.want.KeepAlive) || boolPtr(got.NoDelay) != boolPtr(tc.want.NoDelay) ||
			got.SndBuf != tc.want.SndBuf || got.RecBuf != tc.want.RecBuf {
			t.Errorf("ParseSocketOptions(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
	base := ParseSocketOptions("[{keepalive, true}, {nodelay, false}]")
	m := base.Merge(ParseSocketOptions("[{nodelay, true}]"))
	if !*m.KeepAlive || !*m.NoDelay {
		t.Errorf("Merge = %+v, want keepalive and nodelay true", m)
	}
}

func TestParseProxyAndPoolKey(t *testing.T) {
	for _, tc := range []struct{ in, err string }{
		{"http://proxy:3128", ""},
		{"https://u:p@proxy", ""},
		{"SOCKS5://u:secret@proxy:1080", ""},
		{"ftp://u:secret@proxy", "invalid url"},
		{"::", "invalid url"},
	} {
		u, err := ParseProxy(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "secret") {
				t.Errorf("ParseProxy(%q) = %v, want an error with %q and no password", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || u == nil {
			t.Errorf("ParseProxy(%q) = %v", tc.in, err)
		}
	}
	ep, _ := url.Parse("https://db.example/db/")
	p1, _ := ParseProxy("http://alice:secret@proxy:3128")
	p2, _ := ParseProxy("http://bob:other@proxy:3128")
	k1 := TransportOptions{Proxy: p1}.PoolKey(ep)
	k2 := TransportOptions{Proxy: p2}.PoolKey(ep)
	k0 := TransportOptions{}.PoolKey(ep)
	if !strings.HasPrefix(k1, "https://db.example:443 via http://proxy:3128 #") {
		t.Errorf("PoolKey = %q, want endpoint host:port via proxy host:port", k1)
	}
	if strings.Contains(k1, "secret") || strings.Contains(k1, "alice") {
		t.Errorf("PoolKey %q shows proxy credentials", k1)
	}
	if k1 == k2 || k1 == k0 {
		t.Errorf("pool keys must differ by proxy credentials and proxy: %q %q %q", k0, k1, k2)
	}
	if a, b := (TransportOptions{TLS: TLSOptions{Verify: true}}).PoolKey(ep), k0; a == b {
		t.Errorf("pool keys must differ by TLS settings")
	}
}

// TestErrorBudget: a request that keeps failing stops being retried once
// the error budget is spent, however many retries are left, and returns
// the last error.
func TestErrorBudget(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		writeJSON(w, 503, `{"error":"unavailable","reason":"try later"}`)
	})
	db := f.db(t, Options{Retries: 1 << 30, RetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond,
		ErrorBudget: 200 * time.Millisecond})
	_, err := db.Info(context.Background())
	var herr *HTTPError
	if !errors.As(err, &herr) || herr.Status != 503 {
		t.Fatalf("Info = %v, want the last 503", err)
	}
	if n := len(f.requests()); n < 2 {
		t.Fatalf("%d requests, want retries before the budget ran out", n)
	}
}

// TestConnectTo: connect_to sends a connection for host:port elsewhere while
// the request, the TLS server name and the certificate check keep naming
// the original host (couch_replicator_connect).
func TestConnectTo(t *testing.T) {
	pki := testserver.NewPKI(t)
	tlsSrv := tlsServer(t, pki.ServerCert, pki.ServerKey, "") // certificate for 127.0.0.1 and localhost
	plain := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		if r.Host != "db.example:5984" {
			writeJSON(w, 400, `{"error":"bad_request","reason":"Host `+r.Host+`"}`)
			return
		}
		writeJSON(w, 200, `{"db_name":"db","update_seq":0,"instance_start_time":"0"}`)
	})
	tlsAddr := strings.TrimPrefix(tlsSrv.URL, "https://")
	plainAddr := strings.TrimPrefix(plain.URL, "http://")
	for _, tc := range []struct {
		name, url string
		rules     []string
		tls       TLSOptions
	}{
		{"exact host, TLS verified for the original name", "https://localhost:6984/db",
			[]string{"bad-entry", "localhost:6984:" + tlsAddr}, TLSOptions{Verify: true, CAFile: pki.CAFile}},
		{"wildcard", "http://db.example:5984/db", []string{"other.example:5984:127.0.0.1:1", "*.EXAMPLE:5984:" + plainAddr}, TLSOptions{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := NewTransport(TransportOptions{TLS: tc.tls, ConnectTo: tc.rules})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.CloseIdleConnections()
			ep, _ := ParseEndpoint(tc.url)
			if _, err := NewDB(ep, Options{HTTPClient: &http.Client{Transport: tr}}).Info(context.Background()); err != nil {
				t.Fatalf("Info through connect_to: %v", err)
			}
		})
	}
}
