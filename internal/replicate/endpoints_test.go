package replicate

import (
	"bytes"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/testserver"
)

func TestSessionOptionsFromAuthPlugins(t *testing.T) {
	for _, tc := range []struct {
		plugins  []string
		session  bool
		fallback bool
	}{
		{nil, true, true}, // CouchDB's default
		{[]string{couch.AuthPluginSession, couch.AuthPluginNoop}, true, true},
		{[]string{couch.AuthPluginSession}, true, false},
		{[]string{couch.AuthPluginNoop}, false, false},
		{[]string{couch.AuthPluginNoop, couch.AuthPluginSession}, false, false}, // noop always initialises first
	} {
		o := EndpointConfig{AuthPlugins: tc.plugins, SessionRefresh: time.Minute}.sessionOptions()
		if (o != nil) != tc.session || (o != nil && (o.Fallback != tc.fallback || o.RefreshInterval != time.Minute)) {
			t.Errorf("auth_plugins %v: session options %+v, want session %v fallback %v", tc.plugins, o, tc.session, tc.fallback)
		}
	}
}

func TestTransportOptionsFromParams(t *testing.T) {
	p, err := ParseParams([]byte(`{"source":"https://a.example/s","target":"http://b.example/t",
		"source_proxy":"socks5://u:pw@127.0.0.1:1080","connection_timeout":5000,"socket_options":"[{nodelay, true}]"}`))
	if err != nil {
		t.Fatal(err)
	}
	c := EndpointConfigFrom(config.Default().Replicator)
	c.Socket = couch.ParseSocketOptions("[{keepalive, false}, {nodelay, false}]")
	c.TLS = couch.TLSOptions{Verify: true, CAFile: "/ca.pem", MaxDepth: 2}
	src, err := TransportOptions(p, p.Source, c)
	if err != nil {
		t.Fatal(err)
	}
	if src.Proxy == nil || src.Proxy.Scheme != "socks5" || src.ConnectTimeout != 5*time.Second ||
		!src.TLS.Verify || src.TLS.CAFile != "/ca.pem" || *src.Socket.KeepAlive || !*src.Socket.NoDelay {
		t.Errorf("source transport options %+v", src)
	}
	tgt, err := TransportOptions(p, p.Target, c)
	if err != nil || tgt.Proxy != nil {
		t.Errorf("target transport options %+v, %v: want no proxy", tgt, err)
	}
}

// TestSecurityWarnings: CouchDB's **security warning** lines, from a real
// TLS server whose certificate the trusted file does not know.
func TestSecurityWarnings(t *testing.T) {
	pki := testserver.NewPKI(t)
	cert, err := tls.LoadX509KeyPair(pki.ServerCert, pki.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	defer srv.Close()
	for _, tc := range []struct {
		name  string
		url   string
		cfg   EndpointConfig
		wants []string
	}{
		{"bad cert", srv.URL + "/db", EndpointConfig{VerifyLog: true, TLS: couch.TLSOptions{CAFile: pki.OtherCAFile}},
			[]string{"**security warning** replication by user alice has bad cert in source for reason unknown authority at " + srv.URL + "/db/"}},
		{"good cert", srv.URL + "/db", EndpointConfig{VerifyLog: true, TLS: couch.TLSOptions{CAFile: pki.CAFile}}, nil},
		{"no trusted file", srv.URL + "/db", EndpointConfig{VerifyLog: true},
			[]string{"security warnings enabled but no ssl_trusted_certificates_file configured"}},
		{"verifying anyway", srv.URL + "/db", EndpointConfig{VerifyLog: true, TLS: couch.TLSOptions{Verify: true, CAFile: pki.OtherCAFile}}, nil},
		{"plain http", "http://bob:pw@127.0.0.1:1/db", EndpointConfig{ProtocolsLog: true},
			[]string{"**security warning** replication by user alice has insecure source at http://127.0.0.1:1/db/"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			p, err := ParseParams([]byte(`{"source":"` + tc.url + `","target":"http://127.0.0.1:1/t","user_ctx":{"name":"alice","roles":[]}}`))
			if err != nil {
				t.Fatal(err)
			}
			r := New(p, Options{Logger: zerolog.New(&buf), Endpoints: tc.cfg})
			ep, _ := endpointOf(p.Source)
			to, _ := TransportOptions(p, p.Source, tc.cfg)
			r.securityWarnings(r.log, r.principal(), "source", ep, to)
			out := buf.String()
			for _, w := range tc.wants {
				if !strings.Contains(out, w) {
					t.Errorf("log lacks %q:\n%s", w, out)
				}
			}
			if tc.wants == nil && out != "" {
				t.Errorf("unexpected log: %s", out)
			}
			if strings.Contains(out, ":pw@") {
				t.Errorf("log shows the password: %s", out)
			}
		})
	}
}
