package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
	"github.com/couchrep/couchrep/messages"
)

// Secrets of the expiring-credential tests: the API keys, and every token
// the fake IAM issued (testserver.IAM.Tokens), may appear in no log line,
// API answer, couchrepctl output or status page.
const (
	credKey      = "iam-api-key-0f9e8d7c6b5a"
	credKeyOther = "iam-api-key-other-1a2b3c"
)

// credsEnv: PouchDB Server behind nginx letting through only requests
// with a bearer token the fake IAM issued and that has not expired
// (testserver.TokenProxy), the fake IAM issuing tokens of a configurable
// lifetime, and couchrepd nodes: one allowing credential commands and
// exchanging API keys at the fake IAM, one with the defaults.
type credsEnv struct {
	pouch   *testserver.Server
	iam     *testserver.IAM
	proxy   *testserver.TokenProxy
	node    *nodeProc // allow_credential_commands = true
	plain   *nodeProc // defaults
	outputs []string  // API answers and couchrepctl output, checked for secrets
	written int       // documents written to src
}

func startCredsEnv(t *testing.T, lifetime time.Duration) *credsEnv {
	e := &credsEnv{pouch: testserver.StartPouchDB(t)}
	e.iam = testserver.StartIAM(t, lifetime, credKey, credKeyOther)
	e.proxy = testserver.StartTokenProxy(t, e.iam, e.pouch.URL)
	e.pouch.CreateDB(t, "src")
	e.put(t, 20)
	fast := []string{"COUCHREP_REPLICATOR_STARTUP_JITTER=0", "COUCHREP_REPLICATOR_MIN_BACKOFF_PENALTY_SEC=2",
		"COUCHREP_REPLICATOR_MAX_BACKOFF_PENALTY_SEC=4", "COUCHREP_REPLICATOR_HEALTH_THRESHOLD=2",
		"COUCHREP_REPLICATOR_CHECKPOINT_INTERVAL=2000"}
	e.node = startNode(t, nodeOptions{name: "creds", env: append([]string{
		"COUCHREP_REPLICATOR_IAM_TOKEN_URL=" + e.iam.URL,
		"COUCHREP_REPLICATOR_ALLOW_CREDENTIAL_COMMANDS=true",
		"COUCHREP_REPLICATOR_CREDENTIAL_COMMAND_TIMEOUT=1000",
	}, fast...)})
	e.plain = startNode(t, nodeOptions{name: "plain", env: fast})
	return e
}

// put writes n more documents to src, directly (not through the proxy).
func (e *credsEnv) put(t *testing.T, n int) {
	t.Helper()
	var docs []map[string]any
	for range n {
		docs = append(docs, map[string]any{"_id": fmt.Sprintf("doc-%05d", e.written), "i": e.written})
		e.written++
	}
	e.pouch.PutDocs(t, e.pouch.DBURL("src"), docs...)
}

// docCount is db's doc_count, -1 while db does not exist.
func (e *credsEnv) docCount(t *testing.T, db string) int {
	t.Helper()
	resp, err := http.Get(e.pouch.DBURL(db))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info struct {
		DocCount int `json:"doc_count"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&info) != nil {
		return -1
	}
	return info.DocCount
}

func (e *credsEnv) waitDocs(t *testing.T, db string) {
	t.Helper()
	want := e.written
	waitUntil(t, fmt.Sprintf("%s has %d docs", db, want), 2*time.Minute, func() bool { return e.docCount(t, db) == want })
}

// iamEndpoint is an endpoint through the proxy with an IAM API key.
func (e *credsEnv) iamEndpoint(db, key string) string {
	return fmt.Sprintf(`{"url":%q,"auth":{"iam":{"api_key":%q}}}`, e.proxy.URL+db, key)
}

// commandEndpoint is an endpoint through the proxy whose token a command
// prints.
func (e *credsEnv) commandEndpoint(db string, argv ...string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = fmt.Sprintf("%q", a)
	}
	return fmt.Sprintf(`{"url":%q,"auth":{"bearer":{"command":[%s]}}}`, e.proxy.URL+db, strings.Join(q, ","))
}

// start posts a continuous replication to n and returns its id.
func (e *credsEnv) start(t *testing.T, n *nodeProc, src, tgt string) string {
	t.Helper()
	r := api(t, n.httpAddr(""), "POST", "/_replicate", `{"source":`+src+`,"target":`+tgt+`,"continuous":true,"create_target":true}`)
	e.outputs = append(e.outputs, string(r.body))
	id, _ := r.obj(t)["_local_id"].(string)
	if r.status != 202 || id == "" {
		t.Fatalf("POST /_replicate: %d %s", r.status, r.body)
	}
	return id
}

func (e *credsEnv) cancel(t *testing.T, n *nodeProc, id string) {
	t.Helper()
	r := api(t, n.httpAddr(""), "POST", "/_replicate", `{"replication_id":"`+id+`","cancel":true}`)
	if r.status != 200 {
		t.Fatalf("cancel %s: %d %s", id, r.status, r.body)
	}
}

// job is GET /_scheduler/jobs/{id} on n.
func (e *credsEnv) job(t *testing.T, n *nodeProc, id string) map[string]any {
	t.Helper()
	r := api(t, n.httpAddr(""), "GET", "/_scheduler/jobs/"+id, "")
	e.outputs = append(e.outputs, string(r.body))
	if r.status != 200 {
		t.Fatalf("GET /_scheduler/jobs/%s: %d %s", id, r.status, r.body)
	}
	return r.obj(t)
}

// writeUntilCrashing writes a document to src every 200 ms (the job's
// requests: an idle continuous job sends none) until job id of e.node is
// crashing, and returns it.
func (e *credsEnv) writeUntilCrashing(t *testing.T, id string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		e.put(t, 1)
		if j := e.job(t, e.node, id); j["state"] == "crashing" {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s not crashing after 2 min", id)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// crashes are the job's "crashed" history entries' reasons.
func crashes(j map[string]any) []string {
	var out []string
	h, _ := j["history"].([]any)
	for _, e := range h {
		m, _ := e.(map[string]any)
		if m["type"] == "crashed" {
			r, _ := m["reason"].(string)
			out = append(out, r)
		}
	}
	return out
}

var proxyTok = regexp.MustCompile(`" (\d{3}) tok=(\S*)`)

// proxyStats reads the proxy's own log from line mark on: how many
// requests it refused with 401, and the ids of the tokens it let through.
func (e *credsEnv) proxyStats(mark int) (lines, refused int, tokens map[string]bool) {
	tokens = map[string]bool{}
	all := strings.Split(strings.TrimSpace(e.proxy.Access()), "\n")
	for _, line := range all[min(mark, len(all)):] {
		m := proxyTok.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if m[1] == "401" {
			refused++
		}
		if m[2] != "" && m[2] != "-" {
			tokens[m[2]] = true
		}
	}
	return len(all), refused, tokens
}

// renewals runs continuous jobs through the proxy for d with tokens of
// lifetime: two jobs share one API key (on both sides of one of them),
// another takes its target's token from a command. Documents are written
// all along; every one must arrive, the proxy must refuse no request (its
// log), the jobs must not crash, the tokens must have been renewed at
// least 4 times and the key exchanged once per renewal for all its users.
func (e *credsEnv) renewals(t *testing.T, lifetime, d time.Duration) {
	mark, _, _ := e.proxyStats(0)
	exchanges0, issued0 := e.iam.Exchanges(), e.iam.Issued()
	a := e.start(t, e.node, e.iamEndpoint("src", credKey), e.commandEndpoint("tgt-a", "curl", "-sf", e.iam.MintURL+"?sub=tgt-a"))
	b := e.start(t, e.node, e.iamEndpoint("src", credKey), e.iamEndpoint("tgt-b", credKey))
	e.waitDocs(t, "tgt-a")
	e.waitDocs(t, "tgt-b")
	start := time.Now()
	for time.Since(start) < d {
		e.put(t, 1)
		time.Sleep(250 * time.Millisecond) // the pace of the writes, not synchronisation
	}
	e.waitDocs(t, "tgt-a")
	e.waitDocs(t, "tgt-b")
	took := time.Since(start)
	lines, refused, tokens := e.proxyStats(mark)
	exchanges := e.iam.Exchanges() - exchanges0
	minted := e.iam.Issued() - issued0 - exchanges
	t.Logf("%s of %s tokens: %d docs, %d proxied requests, %d refused, %d tokens used, %d API-key exchanges (2 jobs, 3 endpoints, one key), %d command runs",
		took.Round(time.Second), lifetime, e.written, lines-mark, refused, len(tokens), exchanges, minted)
	if refused != 0 {
		t.Errorf("the proxy refused %d requests (401) across renewals", refused)
	}
	renewals := int(took / (lifetime * 8 / 10))
	if exchanges < 5 || minted < 5 {
		t.Errorf("%d exchanges and %d command runs in %s of %s tokens: want 4+ renewals of each", exchanges, minted, took, lifetime)
	}
	// One exchange per renewal for the three endpoints of one key, not one per endpoint.
	if exchanges > renewals+3 {
		t.Errorf("%d exchanges for one key in %s (%d renewal periods): not shared", exchanges, took, renewals)
	}
	if len(tokens) < 10 {
		t.Errorf("the proxy saw %d tokens, want the renewed ones in use", len(tokens))
	}
	for _, id := range []string{a, b} {
		j := e.job(t, e.node, id)
		if c := crashes(j); len(c) != 0 || j["state"] != "running" {
			t.Errorf("job %s: state %v, crashes %q", id, j["state"], c)
		}
		e.cancel(t, e.node, id)
	}
}

// TestExpiringCredentials: continuous jobs with IAM API keys and a bearer
// command run across renewals of 3-second tokens with no 401 (the token
// proxy's log) and no crash; a renewal the IAM endpoint refuses, and a
// command that fails or hangs, are a clear job error with backoff, and
// the job recovers when the endpoint does; a node without
// allow_credential_commands refuses commands naming the field; no key or
// token shows anywhere.
func TestExpiringCredentials(t *testing.T) {
	skipShort(t)
	lifetime := 3 * time.Second
	e := startCredsEnv(t, lifetime)

	t.Run("continuous jobs across 4+ renewals: no 401, no crash, one exchange per key", func(t *testing.T) {
		e.renewals(t, lifetime, 15*time.Second)
	})

	t.Run("a renewal the IAM endpoint refuses is a job error with backoff, then recovery", func(t *testing.T) {
		id := e.start(t, e.node, e.iamEndpoint("src", credKeyOther), `"`+e.pouch.DBURL("tgt-c")+`"`)
		e.waitDocs(t, "tgt-c")
		e.iam.Fail(400)
		failed := e.iam.Exchanges()
		j := e.writeUntilCrashing(t, id)
		info, _ := j["info"].(map[string]any)
		msg, _ := info["error"].(string)
		for _, w := range []string{"auth.iam.api_key", "refused the API key: 400 BXNIM0400E"} {
			if !strings.Contains(msg, w) {
				t.Errorf("info.error %q does not say %q", msg, w)
			}
		}
		window := time.Now()
		time.Sleep(8 * time.Second) // a window to count crashes and exchanges in
		j = e.job(t, e.node, id)
		c := crashes(j)
		asked := e.iam.Exchanges() - failed
		t.Logf("8 s with the IAM endpoint answering 400: %d crashes, %d exchanges; last error %q", len(c), asked, msg)
		if len(c) > 6 || asked > 8 {
			t.Errorf("a crash loop: %d crashes, %d exchanges in %s", len(c), asked, time.Since(window).Round(time.Second))
		}
		for _, r := range c {
			if strings.Contains(r, "401") || strings.Contains(r, "unauthorized") {
				t.Errorf("a 401 reached the job: %q", r)
			}
		}
		e.iam.Fail(0)
		e.put(t, 3)
		e.waitDocs(t, "tgt-c")
		waitJobState(t, e.node.httpAddr(""), id, "running")

		e.iam.Hang(true)
		e.iam.RevokeAll() // the next request is refused: the renewal hangs
		j = e.writeUntilCrashing(t, id)
		info, _ = j["info"].(map[string]any)
		if msg, _ := info["error"].(string); !strings.Contains(msg, "auth.iam.api_key: the IAM token endpoint") {
			t.Errorf("a hanging IAM endpoint: info.error %q", msg)
		}
		e.iam.Hang(false)
		e.waitDocs(t, "tgt-c")
		e.cancel(t, e.node, id)
	})

	t.Run("a credential command that fails or hangs is a job error naming it", func(t *testing.T) {
		for _, tc := range []struct {
			argv []string
			want string
		}{
			{[]string{"sh", "-c", "echo 'mint: signing key unavailable' >&2; exit 3"}, "auth.bearer.command: sh failed: exit status 3: mint: signing key unavailable"},
			{[]string{"sleep", "30"}, "auth.bearer.command: sleep did not finish within 1s and was killed"},
		} {
			id := e.start(t, e.node, `"`+e.pouch.DBURL("src")+`"`, e.commandEndpoint("tgt-d", tc.argv...))
			j := waitJobState(t, e.node.httpAddr(""), id, "crashing")
			info, _ := j["info"].(map[string]any)
			if msg, _ := info["error"].(string); !strings.Contains(msg, tc.want) {
				t.Errorf("%v: info.error %q, want %q", tc.argv, msg, tc.want)
			}
			e.cancel(t, e.node, id)
		}
	})

	t.Run("without allow_credential_commands a command or a token file is refused naming the field", func(t *testing.T) {
		for _, tc := range []struct{ tgt, field string }{
			{e.commandEndpoint("tgt-e", "curl", "-sf", e.iam.MintURL), "target.auth.bearer.command"},
			{fmt.Sprintf(`{"url":%q,"auth":{"bearer":{"token_file":"/etc/hostname"}}}`, e.proxy.URL+"tgt-e"), "target.auth.bearer.token_file"},
		} {
			r := api(t, e.plain.httpAddr(""), "POST", "/_replicate", `{"source":"`+e.pouch.DBURL("src")+`","target":`+tc.tgt+`,"continuous":true}`)
			e.outputs = append(e.outputs, string(r.body))
			if r.status != 400 || !strings.Contains(string(r.body), tc.field+"` is not allowed on this node") ||
				!strings.Contains(string(r.body), "allow_credential_commands = true") {
				t.Errorf("%s on a node without allow_credential_commands: %d %s", tc.field, r.status, r.body)
			}
		}
	})

	t.Run("no API key or token in logs, API answers, couchrepctl or the status page", func(t *testing.T) {
		// A job running, so that every view has one with its credentials.
		id := e.start(t, e.node, e.iamEndpoint("src", credKey), e.commandEndpoint("tgt-f", "curl", "-sf", e.iam.MintURL+"?sub=tgt-f"))
		e.waitDocs(t, "tgt-f")
		var all []string
		for _, n := range []*nodeProc{e.node, e.plain} {
			for _, args := range [][]string{{"jobs"}, {"jobs", "--json"}, {"--json", "job", "show", id}, {"job", "show", id}, {"nodes"}} {
				out, errOut, _ := n.ctl(args...)
				all = append(all, out, errOut)
			}
			for _, path := range []string{"/_scheduler/jobs", "/_scheduler/docs", "/_active_tasks", "/metrics", "/_status/data", "/_up"} {
				r := api(t, n.httpAddr(""), "GET", path, "")
				all = append(all, string(r.body))
			}
		}
		var list messages.ListJobsResponse
		ctlJSON(t, e.node, &list, "jobs")
		if len(list.GetJobs()) == 0 {
			t.Error("couchrepctl lists no job")
		}
		e.cancel(t, e.node, id)
		for _, n := range []*nodeProc{e.node, e.plain} {
			all = append(all, n.logs.String())
		}
		all = append(all, e.outputs...)
		secrets := []string{credKey, credKeyOther}
		secrets = append(secrets, e.iam.Tokens()...)
		if len(secrets) < 20 {
			t.Fatalf("only %d secrets to look for", len(secrets))
		}
		for _, s := range all {
			for _, sec := range secrets {
				if i := strings.Index(s, sec); i >= 0 {
					t.Errorf("a credential leaked: ...%s...", s[max(0, i-200):min(len(s), i+50)])
				}
			}
			if i := strings.Index(s, "Bearer ey"); i >= 0 {
				t.Errorf("a bearer token leaked: ...%s...", s[max(0, i-200):min(len(s), i+50)])
			}
		}
	})
}

// TestExpiringCredentialsLong is the full run, part of make test:
// 60-second tokens, continuous jobs for 5 minutes (4+ renewals of the IAM
// token and of the command's), at the real lifetimes a token endpoint
// gives (TestExpiringCredentials runs the same with 3 s tokens).
func TestExpiringCredentialsLong(t *testing.T) {
	skipShort(t)
	lifetime := 60 * time.Second
	e := startCredsEnv(t, lifetime)
	e.renewals(t, lifetime, 5*time.Minute)
}
