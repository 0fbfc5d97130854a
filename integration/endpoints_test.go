package integration

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
	"github.com/couchrep/couchrep/messages"
)

// Secrets of the real-endpoint tests: none may appear in a log line, an API
// answer or couchrepctl output.
const (
	epAdminUser  = "bob"
	epAdminPass  = "hunter2-admin-pw"
	epProxyUser  = "proxyuser"
	epProxyPass  = "proxy-pw-3128"
	epSocksUser  = "socksuser"
	epSocksPass  = "socks-pw-1080"
	epDocs       = 60
	epWithAttach = "with-attachment"
	epAttachSize = 2 << 20
)

// endpointsEnv is the real servers of TestRealEndpoints: one PouchDB
// Server behind nginx (plain HTTP, HTTPS, HTTPS requiring a client
// certificate, and a server without /_session), tinyproxy and microsocks,
// and three couchrepd nodes: verifying certificates against the test CA
// with a client certificate (encrypted key), verifying against another CA,
// and CouchDB's defaults (no verification).
type endpointsEnv struct {
	pki                     *testserver.PKI
	pouch                   *testserver.Server
	nginx                   *testserver.Nginx
	tinyproxy, socks        *testserver.ForwardProxy
	verified, wrongCA, open *nodeProc
	outputs                 []string // API answers and couchrepctl output, checked for secrets
	attDigest               string   // of epWithAttach's attachment (the same in src and srcauth)
}

func startEndpointsEnv(t *testing.T) *endpointsEnv {
	e := &endpointsEnv{pki: testserver.NewPKI(t), pouch: testserver.StartPouchDB(t)}
	e.nginx = testserver.StartNginx(t, e.pki, e.pouch.URL)
	e.tinyproxy = testserver.StartTinyproxy(t, epProxyUser, epProxyPass)
	e.socks = testserver.StartMicrosocks(t, epSocksUser, epSocksPass)
	// src is every replication's source but the session tests', which read
	// srcauth: no other job's request (a cancelled job's last checkpoint)
	// can then land among the requests they count.
	for _, name := range []string{"src", "srcauth"} {
		src := e.pouch.CreateDB(t, name)
		var docs []map[string]any
		for i := range epDocs - 1 {
			docs = append(docs, map[string]any{"_id": fmt.Sprintf("doc-%03d", i), "i": i, "pad": strings.Repeat("x", 200)})
		}
		e.pouch.PutDocs(t, src, docs...)
		// Over 1 MiB: its bytes stream through every TLS and proxy path
		// (issue 27).
		e.attDigest = putLargeAttachment(t, src, epWithAttach, 27, epAttachSize)
	}
	for _, db := range []string{"https1", "https2", "untrusted", "mtls", "nocert", "plainproxy", "connect", "tlsproxy", "socks", "sess", "nosess", "budget"} {
		e.pouch.CreateDB(t, db)
	}
	e.pouch.AddAdmin(t, epAdminUser, epAdminPass)
	fast := []string{"COUCHREP_REPLICATOR_STARTUP_JITTER=0", "COUCHREP_REPLICATOR_HEALTH_THRESHOLD=2",
		"COUCHREP_REPLICATOR_MIN_BACKOFF_PENALTY_SEC=2", "COUCHREP_REPLICATOR_MAX_BACKOFF_PENALTY_SEC=4"}
	e.verified = startNode(t, nodeOptions{name: "verified", env: append([]string{
		"COUCHREP_REPLICATOR_VERIFY_SSL_CERTIFICATES=true",
		"COUCHREP_REPLICATOR_SSL_TRUSTED_CERTIFICATES_FILE=" + e.pki.CAFile,
		"COUCHREP_REPLICATOR_CERT_FILE=" + e.pki.ClientCert,
		"COUCHREP_REPLICATOR_KEY_FILE=" + e.pki.ClientKeyEncrypted,
		"COUCHREP_REPLICATOR_PASSWORD=" + e.pki.ClientKeyPassword,
	}, fast...)})
	e.wrongCA = startNode(t, nodeOptions{name: "wrong-ca", env: append([]string{
		"COUCHREP_REPLICATOR_VERIFY_SSL_CERTIFICATES=true",
		"COUCHREP_REPLICATOR_SSL_TRUSTED_CERTIFICATES_FILE=" + e.pki.OtherCAFile,
	}, fast...)})
	e.open = startNode(t, nodeOptions{name: "defaults", env: fast})
	return e
}

// post sends a replication to node n and returns the answer.
func (e *endpointsEnv) post(t *testing.T, n *nodeProc, body string) apiReply {
	t.Helper()
	r := api(t, n.httpAddr(""), "POST", "/_replicate", body)
	e.outputs = append(e.outputs, string(r.body))
	return r
}

func (e *endpointsEnv) jobs(t *testing.T, n *nodeProc) string {
	t.Helper()
	r := api(t, n.httpAddr(""), "GET", "/_scheduler/jobs", "")
	e.outputs = append(e.outputs, string(r.body))
	return string(r.body)
}

func (e *endpointsEnv) docCount(t *testing.T, db string) int {
	t.Helper()
	var info struct {
		DocCount int `json:"doc_count"`
	}
	e.pouch.GetJSON(t, e.pouch.DBURL(db), &info)
	return info.DocCount
}

func (e *endpointsEnv) waitDocs(t *testing.T, db string, want int) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%s has %d docs", db, want), 2*time.Minute, func() bool { return e.docCount(t, db) == want })
}

// oneShot runs a one-shot replication on n and fails unless it succeeds
// and the target has every document.
func (e *endpointsEnv) oneShot(t *testing.T, n *nodeProc, body, tgtDB string) {
	t.Helper()
	r := e.post(t, n, body)
	if m := r.obj(t); r.status != 200 || m["ok"] != true {
		t.Fatalf("one-shot replication: %d %s", r.status, r.body)
	}
	if got := e.docCount(t, tgtDB); got != epDocs {
		t.Fatalf("target %s has %d docs, want %d", tgtDB, got, epDocs)
	}
	if n, digest := attachmentDigest(t, e.pouch.DBURL(tgtDB), epWithAttach); n != epAttachSize || digest != e.attDigest {
		t.Fatalf("target %s: %s's attachment is %d bytes %s, want %d %s", tgtDB, epWithAttach, n, digest, epAttachSize, e.attDigest)
	}
}

func jsonStr(s string) string { return fmt.Sprintf("%q", s) }

// TestRealEndpoints replicates through real nginx (TLS, client
// certificates), a real HTTP proxy and a real SOCKS5 server, and with
// cookie sessions, each case proven by the server's or proxy's own log.
func TestRealEndpoints(t *testing.T) {
	skipShort(t)
	e := startEndpointsEnv(t)
	src := func(base string) string { return jsonStr(base + "src") }
	tgt := func(base, db string) string { return jsonStr(base + db) }

	t.Run("https one-shot, certificate verified against the trusted CA", func(t *testing.T) {
		e.oneShot(t, e.verified, `{"source":`+src(e.nginx.HTTPSURL)+`,"target":`+tgt(e.nginx.HTTPSURL, "https1")+`}`, "https1")
	})

	t.Run("https continuous, verified", func(t *testing.T) {
		r := e.post(t, e.verified, `{"source":`+src(e.nginx.HTTPSURL)+`,"target":`+tgt(e.nginx.HTTPSURL, "https2")+`,"continuous":true}`)
		id, _ := r.obj(t)["_local_id"].(string)
		if r.status != 202 || id == "" {
			t.Fatalf("POST: %d %s", r.status, r.body)
		}
		e.waitDocs(t, "https2", epDocs)
		e.pouch.PutDocs(t, e.pouch.DBURL("src"), map[string]any{"_id": "late-https"})
		e.waitDocs(t, "https2", epDocs+1)
		// the late doc stays in src: later targets get epDocs+1 unless they ran before
		api(t, e.verified.httpAddr(""), "POST", "/_replicate", `{"replication_id":"`+id+`","cancel":true}`)
		e.pouch.Do(t, "DELETE", e.pouch.DBURL("src")+"late-https?rev="+revOf(t, e.pouch, "src", "late-https"), nil, 200)
	})

	t.Run("CA not trusted: crashing with the certificate error, nothing written", func(t *testing.T) {
		r := e.post(t, e.wrongCA, `{"source":`+src(e.nginx.HTTPSURL)+`,"target":`+tgt(e.nginx.HTTPSURL, "untrusted")+`,"continuous":true}`)
		id, _ := r.obj(t)["_local_id"].(string)
		if r.status != 202 || id == "" {
			t.Fatalf("POST: %d %s", r.status, r.body)
		}
		j := waitJobState(t, e.wrongCA.httpAddr(""), id, "crashing")
		info, _ := j["info"].(map[string]any)
		msg, _ := info["error"].(string)
		if !strings.Contains(msg, "unknown authority") || !strings.Contains(msg, e.nginx.HTTPSURL) {
			t.Fatalf("info.error = %q, want the endpoint %s and \"unknown authority\"", msg, e.nginx.HTTPSURL)
		}
		if n := e.docCount(t, "untrusted"); n != 0 {
			t.Fatalf("target has %d docs, want none", n)
		}
		e.jobs(t, e.wrongCA)
		api(t, e.wrongCA.httpAddr(""), "POST", "/_replicate", `{"replication_id":"`+id+`","cancel":true}`)
	})

	t.Run("client certificate required: with cert_file (encrypted key)", func(t *testing.T) {
		e.oneShot(t, e.verified, `{"source":`+src(e.nginx.ClientCertURL)+`,"target":`+tgt(e.nginx.ClientCertURL, "mtls")+`}`, "mtls")
	})

	t.Run("client certificate required: without cert_file", func(t *testing.T) {
		r := e.post(t, e.open, `{"source":`+src(e.nginx.ClientCertURL)+`,"target":`+tgt(e.nginx.ClientCertURL, "nocert")+`,"continuous":true}`)
		id, _ := r.obj(t)["_local_id"].(string)
		j := waitJobState(t, e.open.httpAddr(""), id, "crashing")
		info, _ := j["info"].(map[string]any)
		if msg, _ := info["error"].(string); !strings.Contains(msg, "400") || !strings.Contains(msg, e.nginx.ClientCertURL) {
			t.Fatalf("info.error = %q, want nginx's 400 (no client certificate) for %s", msg, e.nginx.ClientCertURL)
		}
		if n := e.docCount(t, "nocert"); n != 0 {
			t.Fatalf("target has %d docs, want none", n)
		}
		api(t, e.open.httpAddr(""), "POST", "/_replicate", `{"replication_id":"`+id+`","cancel":true}`)
	})

	proxyWithCreds := func(p *testserver.ForwardProxy) string { return jsonStr(p.URL) }

	t.Run("http proxy, plain http endpoints", func(t *testing.T) {
		e.oneShot(t, e.open, `{"source":`+src(e.nginx.HTTPURL)+`,"target":`+tgt(e.nginx.HTTPURL, "plainproxy")+`,"proxy":`+proxyWithCreds(e.tinyproxy)+`}`, "plainproxy")
		log := e.tinyproxy.Log()
		for _, req := range []string{"GET " + e.nginx.HTTPURL + "src/_changes", "POST " + e.nginx.HTTPURL + "src/_bulk_get",
			"POST " + e.nginx.HTTPURL + "plainproxy/_bulk_docs", "PUT " + e.nginx.HTTPURL + "src/_local/", "PUT " + e.nginx.HTTPURL + "plainproxy/_local/"} {
			if testserver.CountLines(log, "Request (file descriptor", req) == 0 {
				t.Errorf("tinyproxy's log has no %q request:\n%s", req, log)
			}
		}
	})

	t.Run("http proxy, https endpoints through CONNECT", func(t *testing.T) {
		u, _ := url.Parse(e.nginx.HTTPSURL)
		before := testserver.CountLines(e.tinyproxy.Log(), "CONNECT "+u.Host)
		e.oneShot(t, e.verified, `{"source":`+src(e.nginx.HTTPSURL)+`,"target":`+tgt(e.nginx.HTTPSURL, "connect")+`,"source_proxy":`+proxyWithCreds(e.tinyproxy)+`,"target_proxy":`+proxyWithCreds(e.tinyproxy)+`}`, "connect")
		if after := testserver.CountLines(e.tinyproxy.Log(), "CONNECT "+u.Host); after <= before {
			t.Fatalf("tinyproxy's log has no new CONNECT %s:\n%s", u.Host, e.tinyproxy.Log())
		}
	})

	t.Run("https proxy (TLS to the proxy, verified), https endpoints", func(t *testing.T) {
		tlsProxy := testserver.StartTLSProxy(t, e.pki, e.tinyproxy)
		u, _ := url.Parse(e.nginx.HTTPSURL)
		before := testserver.CountLines(e.tinyproxy.Log(), "CONNECT "+u.Host)
		e.oneShot(t, e.verified, `{"source":`+src(e.nginx.HTTPSURL)+`,"target":`+tgt(e.nginx.HTTPSURL, "tlsproxy")+`,"proxy":`+jsonStr(tlsProxy.URL)+`}`, "tlsproxy")
		if after := testserver.CountLines(e.tinyproxy.Log(), "CONNECT "+u.Host); after <= before {
			t.Fatalf("tinyproxy (behind the TLS front) logged no new CONNECT %s:\n%s", u.Host, e.tinyproxy.Log())
		}
	})

	t.Run("socks5 proxy, continuous, shown redacted in _scheduler/jobs", func(t *testing.T) {
		r := e.post(t, e.verified, `{"source":`+src(e.nginx.HTTPURL)+`,"target":`+tgt(e.nginx.HTTPSURL, "socks")+`,"proxy":`+proxyWithCreds(e.socks)+`,"continuous":true}`)
		id, _ := r.obj(t)["_local_id"].(string)
		if r.status != 202 || id == "" {
			t.Fatalf("POST: %d %s", r.status, r.body)
		}
		e.waitDocs(t, "socks", epDocs)
		jobs := e.jobs(t, e.verified)
		want := "socks5://" + epSocksUser + ":*****@" + e.socks.Addr
		if !strings.Contains(jobs, `"source_proxy":"`+want+`"`) || !strings.Contains(jobs, `"target_proxy":"`+want+`"`) {
			t.Errorf("_scheduler/jobs does not show source_proxy/target_proxy %s: %s", want, jobs)
		}
		api(t, e.verified.httpAddr(""), "POST", "/_replicate", `{"replication_id":"`+id+`","cancel":true}`)
		log := e.socks.Log()
		for _, u := range []string{e.nginx.HTTPURL, e.nginx.HTTPSURL} {
			pu, _ := url.Parse(u)
			if testserver.CountLines(log, "connected to "+pu.Host) == 0 {
				t.Errorf("microsocks' log has no connection to %s:\n%s", pu.Host, log)
			}
		}
	})

	auth := func(base, db string) string {
		return `{"url":` + jsonStr(base+db) + `,"auth":{"basic":{"username":"` + epAdminUser + `","password":"` + epAdminPass + `"}}}`
	}
	t.Run("cookie session: one POST /_session per server and user, then the cookie", func(t *testing.T) {
		mark := strings.Count(e.nginx.Access(), "\n")
		e.oneShot(t, e.open, `{"source":`+auth(e.nginx.HTTPURL, "srcauth")+`,"target":`+auth(e.nginx.HTTPURL, "sess")+`}`, "sess")
		lines := sessionLines(e.nginx.Access(), mark, "sess")
		var posts, cookie, other int
		for _, l := range lines {
			switch {
			case l == "":
			case strings.Contains(l, `"POST /_session `):
				posts++
			case strings.HasSuffix(l, " auth=cookie"):
				cookie++
			default:
				other++
				t.Errorf("a request without the session cookie (or with basic auth): %s", l)
			}
		}
		// Source and target are one server with the same credentials: one
		// session (docs/operations.md).
		if posts != 1 || cookie < 10 || other != 0 {
			t.Fatalf("nginx saw %d POST /_session, %d cookie requests, %d others; want 1 (source and target share it), many, 0", posts, cookie, other)
		}
	})

	t.Run("no /_session (404): basic auth", func(t *testing.T) {
		mark := strings.Count(e.nginx.Access(), "\n")
		e.oneShot(t, e.open, `{"source":`+auth(e.nginx.NoSessionURL, "srcauth")+`,"target":`+auth(e.nginx.NoSessionURL, "nosess")+`}`, "nosess")
		lines := sessionLines(e.nginx.Access(), mark, "nosess")
		var posts, basic int
		for _, l := range lines {
			switch {
			case l == "":
			case strings.Contains(l, `"POST /_session `) && strings.Contains(l, "404"):
				posts++
			case strings.HasSuffix(l, " auth=basic"):
				basic++
			default:
				t.Errorf("a request without basic auth: %s", l)
			}
		}
		if posts != 1 || basic < 10 {
			t.Fatalf("nginx saw %d POST /_session (404) and %d basic requests; want 1 (source and target share it) and many", posts, basic)
		}
	})

	t.Run("a server that refuses connections: crash after the budget, recovery when it is back", func(t *testing.T) {
		r := e.post(t, e.open, `{"source":`+src(e.nginx.HTTPURL)+`,"target":`+jsonStr(e.pouch.DBURL("budget"))+`,"continuous":true,"retries_per_request":3}`)
		id, _ := r.obj(t)["_local_id"].(string)
		if r.status != 202 || id == "" {
			t.Fatalf("POST: %d %s", r.status, r.body)
		}
		e.waitDocs(t, "budget", epDocs)
		e.nginx.Stop()
		j := waitJobState(t, e.open.httpAddr(""), id, "crashing")
		info, _ := j["info"].(map[string]any)
		if msg, _ := info["error"].(string); !strings.Contains(msg, "connection refused") {
			t.Errorf("info.error = %q, want the last error (connection refused)", msg)
		}
		e.nginx.Restart(t)
		e.pouch.PutDocs(t, e.pouch.DBURL("src"), map[string]any{"_id": "after-the-outage"})
		e.waitDocs(t, "budget", epDocs+1)
		waitJobState(t, e.open.httpAddr(""), id, "running")
		api(t, e.open.httpAddr(""), "POST", "/_replicate", `{"replication_id":"`+id+`","cancel":true}`)
	})

	t.Run("requests through the per-endpoint transports are counted in /metrics", func(t *testing.T) {
		met := string(api(t, e.verified.httpAddr(""), "GET", "/metrics", "").body)
		if !regexp.MustCompile(`couchrep_replication_requests_total\{method="POST"\} [1-9]`).MatchString(met) {
			t.Fatalf("/metrics counts no replication request:\n%s", met)
		}
	})

	t.Run("no credential in logs, API answers or couchrepctl output", func(t *testing.T) {
		var all []string
		shown := 0
		for _, n := range []*nodeProc{e.verified, e.wrongCA, e.open} {
			out, _, _ := n.ctl("jobs", "--json")
			all = append(all, out)
			out, _, _ = n.ctl("jobs")
			all = append(all, out)
			var list messages.ListJobsResponse
			ctlJSON(t, n, &list, "jobs")
			for _, j := range list.GetJobs() {
				out, _, _ = n.ctl("job", "show", j.GetId())
				all = append(all, out)
				out, _, _ = n.ctl("--json", "job", "show", j.GetId())
				all = append(all, out)
				shown++
			}
		}
		for _, n := range []*nodeProc{e.verified, e.wrongCA, e.open} {
			for _, path := range []string{"/_scheduler/jobs", "/_scheduler/docs", "/_active_tasks", "/metrics", "/_status/data"} {
				r := api(t, n.httpAddr(""), "GET", path, "")
				if r.status != 200 {
					t.Errorf("GET %s: %d %s", path, r.status, r.body)
				}
				all = append(all, string(r.body))
			}
		}
		if shown == 0 {
			t.Error("couchrepctl listed no job to show")
		}
		for _, n := range []*nodeProc{e.verified, e.wrongCA, e.open} {
			all = append(all, n.logs.String()) // last: after every command above
		}
		all = append(all, e.outputs...)
		secret := regexp.MustCompile(regexp.QuoteMeta(epAdminPass) + "|" + regexp.QuoteMeta(epProxyPass) + "|" +
			regexp.QuoteMeta(epSocksPass) + "|" + regexp.QuoteMeta(e.pki.ClientKeyPassword) + `|AuthSession=|(?i)authorization"?\s*[:=]\s*"?basic`)
		for _, s := range all {
			if m := secret.FindString(s); m != "" {
				i := strings.Index(s, m)
				t.Errorf("a credential (%q) leaked: ...%s...", m, s[max(0, i-200):min(len(s), i+100)])
			}
		}
	})
}

func revOf(t *testing.T, s *testserver.Server, db, id string) string {
	t.Helper()
	var d struct {
		Rev string `json:"_rev"`
	}
	s.GetJSON(t, s.DBURL(db)+id, &d)
	return d.Rev
}

// TestUnknownAuthPluginStopsTheNode: an auth_plugins entry couchrep does
// not have stops couchrepd at start with an error naming it.
func TestUnknownAuthPluginStopsTheNode(t *testing.T) {
	skipShort(t)
	cmd := exec.Command(filepath.Join(binDir, "couchrepd"), "--data", t.TempDir(), "--admin", "127.0.0.1:0", "--http", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "COUCHREP_REPLICATOR_AUTH_PLUGINS=couch_replicator_auth_session,my_ldap_plugin")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("couchrepd = %v, want exit status 2:\n%s", err, out)
	}
	if !strings.Contains(string(out), "auth_plugins") || !strings.Contains(string(out), "my_ldap_plugin") {
		t.Fatalf("couchrepd's error does not name the plugin:\n%s", out)
	}
}

// sessionLines are the access log lines after the first mark lines that
// belong to a session test's replication: /_session, /srcauth and /<tgt>.
func sessionLines(log string, mark int, tgt string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n")[mark:] {
		if strings.Contains(l, " /_session ") || strings.Contains(l, " /srcauth") || strings.Contains(l, " /"+tgt) {
			out = append(out, l)
		}
	}
	return out
}
