package httpserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/httpserver"
	"github.com/couchrep/couchrep/internal/cluster"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/supervisor"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func openStore(t *testing.T) kv.Database {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// authServer is a CouchDB's GET /_session for joe (erlanger) and boss
// (_admin); it records the Authorization headers it gets.
type authServer struct {
	*httptest.Server
	mu   sync.Mutex
	auth []string
}

func newAuthServer(t *testing.T) *authServer {
	a := &authServer{}
	users := map[string][2]string{"joe": {"erly-pw", "erlanger"}, "boss": {"boss-pw", "_admin"}}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.auth = append(a.auth, r.Header.Get("Authorization"))
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		name, pass, ok := r.BasicAuth()
		u, known := users[name]
		switch {
		case r.URL.Path != "/_session":
			w.WriteHeader(http.StatusNotFound)
		case !ok:
			io.WriteString(w, `{"ok":true,"userCtx":{"name":null,"roles":[]}}`)
		case !known || u[0] != pass:
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":"unauthorized","reason":"Name or password is incorrect."}`)
		default:
			json.NewEncoder(w).Encode(map[string]any{"ok": true, "userCtx": map[string]any{"name": name, "roles": []string{u[1]}}})
		}
	}))
	t.Cleanup(a.Close)
	return a
}

// withCreds is the auth server's URL with credentials of its own, which
// must never be sent with a user's.
func (a *authServer) withCreds() string {
	u, _ := url.Parse(a.URL)
	u.User = url.UserPassword("svc", "svc-pw")
	return u.String()
}

// startAPI starts the http_api actor of one node on db and returns its
// address.
func startAPI(t *testing.T, db kv.Database, logs io.Writer, mod func(*config.Config)) string {
	t.Helper()
	system := actor.NewActorSystem()
	t.Cleanup(system.Shutdown)
	cfg := config.Default()
	cfg.Couchrep.NodeName = "n-" + filepath.Base(t.TempDir())
	cfg.Couchrep.DataDir = t.TempDir()
	cfg.Couchrep.HTTPBind = "127.0.0.1:0"
	cfg.CouchDB.UUID = "0123456789abcdef0123456789abcdef"
	if mod != nil {
		mod(&cfg)
	}
	q := jobqueue.New(db, jobqueue.Options{NodeName: cfg.Couchrep.NodeName})
	store := repjob.New(q, db, repjob.Options{ServerUUID: cfg.CouchDB.UUID})
	deps := actors.Deps{Config: cfg, Logger: zerolog.New(logs), System: system, Store: db, Jobs: q, RepJobs: store}
	sup, err := supervisor.Start(t.Context(), system, "couchrep_sup", supervisor.Spec{
		Strategy: supervisor.OneForOne, MaxRestarts: 1, Period: time.Second, Children: []supervisor.ChildSpec{httpserver.Spec(deps)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sup.Stop(context.Background()) })
	// The actor writes http.addr before its start returns.
	b, err := os.ReadFile(filepath.Join(cfg.Couchrep.DataDir, httpserver.AddrFile))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

type reply struct {
	status int
	body   string
	header http.Header
}

func do(t *testing.T, addr, method, path, ctype, body, user, pass, cookie string) reply {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: "AuthSession", Value: cookie})
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, body: string(b), header: resp.Header}
}

func sessionCookie(r reply) string {
	for _, c := range (&http.Response{Header: r.header}).Cookies() {
		if c.Name == "AuthSession" {
			return c.Value
		}
	}
	return ""
}

// TestUsersOptions: who may use the API follows the node's config:
// no [admins] and no auth_server is an admin party; [admins] alone admits
// only them; [admins] with watched servers takes its users from the first
// of them; auth_server alone admits that server's users and nobody
// anonymous. Anonymous requests are refused as CouchDB refuses them, a
// user who is not an admin gets 403 on _scheduler/jobs.
func TestUsersOptions(t *testing.T) {
	a := newAuthServer(t)
	db := openStore(t)
	for _, tc := range []struct {
		name            string
		mod             func(*config.Config)
		anonymous, user int
	}{
		{"admin party", nil, 200, 200},
		{"[admins] only", func(c *config.Config) { c.Admins = map[string]string{"admin": "admin-pw"} }, 401, 401},
		{"[admins] and watch", func(c *config.Config) {
			c.Admins = map[string]string{"admin": "admin-pw"}
			c.Couchrep.Watch = []string{a.withCreds(), "http://127.0.0.1:1"}
		}, 401, 403},
		{"auth_server only", func(c *config.Config) { c.Couchrep.AuthServer = a.withCreds() }, 401, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs syncBuffer
			addr := startAPI(t, db, &logs, tc.mod)
			if r := do(t, addr, "GET", "/_scheduler/jobs", "", "", "", "", ""); r.status != tc.anonymous {
				t.Errorf("anonymous: %d %s, want %d", r.status, r.body, tc.anonymous)
			}
			if r := do(t, addr, "GET", "/_scheduler/jobs", "", "", "joe", "erly-pw", ""); r.status != tc.user {
				t.Errorf("joe: %d %s, want %d", r.status, r.body, tc.user)
			}
			party := strings.Contains(logs.String(), `"admin_party":true`)
			if party != (tc.mod == nil) {
				t.Errorf("admin_party logged %v, want %v", party, tc.mod == nil)
			}
			if strings.Contains(logs.String(), "svc-pw") || strings.Contains(logs.String(), "erly-pw") {
				t.Errorf("a password in the log: %s", logs.String())
			}
		})
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, h := range a.auth {
		if strings.HasPrefix(h, "Basic ") && !strings.Contains(h, "am9lOmVybHktcHc") { // base64("joe:erly-pw")
			t.Errorf("the auth server got credentials other than the user's: %q", h)
		}
	}
}

// TestSessionAcrossNodes: two nodes on one store sign their session
// cookies with the secret kept there (cluster.SessionSecret), so a cookie
// of one works on the other; a node of another store refuses it.
func TestSessionAcrossNodes(t *testing.T) {
	a := newAuthServer(t)
	db := openStore(t)
	var logs syncBuffer
	users := func(c *config.Config) { c.Couchrep.AuthServer = a.URL }
	n1, n2 := startAPI(t, db, &logs, users), startAPI(t, db, &logs, users)
	other := startAPI(t, openStore(t), &logs, users)

	login := do(t, n1, "POST", "/_session", "application/json", `{"name":"boss","password":"boss-pw"}`, "", "", "")
	cookie := sessionCookie(login)
	if login.status != 200 || cookie == "" {
		t.Fatalf("login on node 1: %d %s", login.status, login.body)
	}
	secret, err := cluster.SessionSecret(t.Context(), db)
	if err != nil || len(secret) != cluster.SessionSecretBytes {
		t.Fatalf("the store's session secret: %x %v", secret, err)
	}
	if r := do(t, n2, "GET", "/_scheduler/jobs", "", "", "", "", cookie); r.status != 200 {
		t.Fatalf("node 1's admin cookie on node 2: %d %s", r.status, r.body)
	}
	if r := do(t, other, "GET", "/_scheduler/jobs", "", "", "", "", cookie); r.status != 401 {
		t.Fatalf("the cookie on a node of another store: %d %s", r.status, r.body)
	}
	joe := sessionCookie(do(t, n2, "POST", "/_session", "application/x-www-form-urlencoded", "name=joe&password=erly-pw", "", "", ""))
	r := do(t, n1, "GET", "/_session", "", "", "", "", joe)
	var s struct {
		UserCtx struct {
			Name  string   `json:"name"`
			Roles []string `json:"roles"`
		} `json:"userCtx"`
	}
	if err := json.Unmarshal([]byte(r.body), &s); err != nil || s.UserCtx.Name != "joe" || len(s.UserCtx.Roles) != 1 || s.UserCtx.Roles[0] != "erlanger" {
		t.Fatalf("joe's cookie of node 2 on node 1: %d %s", r.status, r.body)
	}
	for _, secret := range []string{"boss-pw", "erly-pw", cookie, joe} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("the log holds %q", secret)
		}
	}
}
