package couch

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// tokenDB is a database server that accepts a request only with a bearer
// token the fake IAM says is valid (as the token proxy of the integration
// tests does), and counts the 401s it answered.
type tokenDB struct {
	*httptest.Server
	refused atomic.Int64
	ok      atomic.Int64
}

func newTokenDB(t *testing.T, iam *testserver.IAM) *tokenDB {
	d := &tokenDB{}
	d.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, iam.CheckURL, nil)
		req.Header.Set("Authorization", r.Header.Get("Authorization"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusNoContent {
			d.refused.Add(1)
			writeJSON(w, 401, `{"error":"unauthorized","reason":"bad token"}`)
			return
		}
		resp.Body.Close()
		d.ok.Add(1)
		writeJSON(w, 200, `{"db_name":"db","update_seq":"1","doc_count":0,"instance_start_time":"0"}`)
	}))
	t.Cleanup(d.Close)
	return d
}

func tokenEndpoint(t *testing.T, url string, a *TokenAuth) Endpoint {
	t.Helper()
	ep, err := ParseEndpoint(map[string]any{"url": url + "/db", "auth": a.Object()})
	if err != nil {
		t.Fatal(err)
	}
	if ep.Token == nil {
		t.Fatalf("no token in %v", ep)
	}
	return ep
}

// TestIAMTokenSharedAndRenewed: DBs with one API key share one exchange
// (not one per DB), the token is renewed before it expires (at 80 % of its
// life) while requests go on, and no request is ever refused.
func TestIAMTokenSharedAndRenewed(t *testing.T) {
	iam := testserver.StartIAM(t, time.Second, "key-1")
	db := newTokenDB(t, iam)
	to := &TokenOptions{IAMURL: iam.URL, Cache: NewTokens()}
	const n = 8
	dbs := make([]*DB, n)
	for i := range dbs {
		dbs[i] = NewDB(tokenEndpoint(t, db.URL, &TokenAuth{IAMKey: "key-1"}), Options{Tokens: to})
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, d := range dbs {
		wg.Go(func() {
			if _, err := d.Info(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := iam.Exchanges(); got != 1 {
		t.Fatalf("%d DBs with one key made %d exchanges, want 1", n, got)
	}
	if to.Cache.len() != 1 {
		t.Fatalf("cache holds %d sources, want 1", to.Cache.len())
	}
	end := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(end) {
		for _, d := range dbs {
			if _, err := d.Info(ctx); err != nil {
				t.Fatalf("request across renewals: %v", err)
			}
		}
		time.Sleep(20 * time.Millisecond) // request pacing, not synchronisation
	}
	// 2.5 s of 1 s tokens renewed at 0.8 s: 3 renewals after the first
	// (2 on a machine too busy to keep the pace); 8 DBs, not 8 times that.
	if got := iam.Exchanges(); got < 3 || got > 6 {
		t.Fatalf("%d exchanges in 2.5 s of 1 s tokens, want 3-6", got)
	}
	if r := db.refused.Load(); r != 0 {
		t.Fatalf("%d requests refused across renewals", r)
	}
}

// TestIAMTokenRenewedOn401: a token the server refuses before its expiry
// is renewed once and the request sent again; a renewed token refused as
// well is the request's error (no loop of exchanges).
func TestIAMTokenRenewedOn401(t *testing.T) {
	iam := testserver.StartIAM(t, time.Minute, "key-1")
	db := newTokenDB(t, iam)
	d := NewDB(tokenEndpoint(t, db.URL, &TokenAuth{IAMKey: "key-1"}), Options{Tokens: &TokenOptions{IAMURL: iam.URL, Cache: NewTokens()}})
	ctx := context.Background()
	if _, err := d.Info(ctx); err != nil {
		t.Fatal(err)
	}
	iam.RevokeAll()
	if _, err := d.Info(ctx); err != nil {
		t.Fatalf("after a revocation: %v", err)
	}
	if got, r := iam.Exchanges(), db.refused.Load(); got != 2 || r != 1 {
		t.Fatalf("exchanges %d, refused %d; want 2 and 1", got, r)
	}
	// Refused again within tokenForcedEvery: the 401 stands.
	iam.RevokeAll()
	_, err := d.Info(ctx)
	if !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("a token refused again at once: %v, want ErrUnauthorized", err)
	}
	if got := iam.Exchanges(); got != 2 {
		t.Fatalf("%d exchanges: 401s renew at most once per %s", got, tokenForcedEvery)
	}
}

// TestIAMTokenRefused: an IAM endpoint that refuses the key, fails or
// hangs is a clear error naming the field and the answer, never the key,
// and the endpoint is not asked again before the retry wait.
func TestIAMTokenRefused(t *testing.T) {
	const key = "sekrit-api-key-42"
	iam := testserver.StartIAM(t, time.Minute, "other")
	db := newTokenDB(t, iam)
	for _, tc := range []struct {
		name  string
		setup func()
		want  []string
	}{
		{"unknown key", func() {}, []string{"auth.iam.api_key", "refused the API key: 400 BXNIM0415E"}},
		{"500", func() { iam.Fail(500) }, []string{"auth.iam.api_key", "500 BXNIM0400E"}},
		{"hang", func() { iam.Fail(0); iam.Hang(true) }, []string{"auth.iam.api_key", "could not be reached"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.setup()
			before := iam.Exchanges()
			d := NewDB(tokenEndpoint(t, db.URL, &TokenAuth{IAMKey: key}),
				Options{Tokens: &TokenOptions{IAMURL: iam.URL, Cache: NewTokens(), CommandTimeout: 300 * time.Millisecond}})
			start := time.Now()
			_, err := d.Info(context.Background())
			if !errors.Is(err, ErrCredentials) {
				t.Fatalf("error %v, want ErrCredentials", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), key) {
				t.Errorf("error %q holds the API key", err)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("the failure took %s", took)
			}
			for range 5 {
				if _, err2 := d.Info(context.Background()); !errors.Is(err2, ErrCredentials) {
					t.Fatalf("again: %v", err2)
				}
			}
			if got := iam.Exchanges() - before; tc.name != "hang" && got != 1 {
				t.Errorf("6 requests within the retry wait made %d exchanges, want 1", got)
			}
		})
	}
	iam.Hang(false)
	if db.ok.Load() != 0 {
		t.Fatal("a request got through without a token")
	}
}

// TestBearerCommand: a credential command's JSON output is the token, run
// again before it expires; one that is not allowed, fails or hangs is a
// clear error naming the field.
func TestBearerCommand(t *testing.T) {
	iam := testserver.StartIAM(t, time.Second)
	db := newTokenDB(t, iam)
	mint := &TokenAuth{Command: []string{"curl", "-sf", iam.MintURL + "?sub=cmd"}}
	ctx := context.Background()

	d := NewDB(tokenEndpoint(t, db.URL, mint), Options{Tokens: &TokenOptions{Cache: NewTokens()}})
	_, err := d.Info(ctx)
	if !errors.Is(err, ErrCredentialCommandsDisabled) || !strings.Contains(err.Error(), "auth.bearer.command is not allowed") ||
		!strings.Contains(err.Error(), "allow_credential_commands = true") {
		t.Fatalf("command without allow_credential_commands: %v", err)
	}

	to := &TokenOptions{AllowCommands: true, Cache: NewTokens(), CommandTimeout: 500 * time.Millisecond}
	d = NewDB(tokenEndpoint(t, db.URL, mint), Options{Tokens: to})
	end := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(end) {
		if _, err := d.Info(ctx); err != nil {
			t.Fatalf("across command renewals: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // request pacing
	}
	if n := iam.Issued(); n < 3 || n > 6 {
		t.Fatalf("the command ran %d times in 2.5 s of 1 s tokens, want 3-6", n)
	}

	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"sh", "-c", "echo 'vault: permission denied' >&2; exit 3"}, "auth.bearer.command: sh failed: exit status 3: vault: permission denied"},
		{[]string{"sleep", "30"}, "auth.bearer.command: sleep did not finish within 500ms and was killed"},
		{[]string{"echo", "two words"}, "a raw token is one word"},
		{[]string{"/nonexistent/helper"}, "auth.bearer.command: /nonexistent/helper failed"},
	} {
		start := time.Now()
		_, err := NewDB(tokenEndpoint(t, db.URL, &TokenAuth{Command: tc.argv}), Options{Tokens: to}).Info(ctx)
		if !errors.Is(err, ErrCredentials) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.argv, err, tc.want)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("%v took %s", tc.argv, took)
		}
	}
}

// TestBearerFile: a token file is read again when it changes.
func TestBearerFile(t *testing.T) {
	iam := testserver.StartIAM(t, time.Hour)
	db := newTokenDB(t, iam)
	path := filepath.Join(t.TempDir(), "token")
	mintTo := func() {
		t.Helper()
		resp, err := http.Get(iam.MintURL + "?sub=file")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		f, err := os.CreateTemp(filepath.Dir(path), "tok")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.ReadFrom(resp.Body); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if err := os.Rename(f.Name(), path); err != nil {
			t.Fatal(err)
		}
	}
	mintTo()
	d := NewDB(tokenEndpoint(t, db.URL, &TokenAuth{File: path}), Options{Tokens: &TokenOptions{AllowCommands: true, Cache: NewTokens()}})
	ctx := context.Background()
	if _, err := d.Info(ctx); err != nil {
		t.Fatal(err)
	}
	// The old token stops working; the file gets a new one.
	iam.RevokeAll()
	mintTo()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := d.Info(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new token in the file was not used: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	missing := filepath.Join(t.TempDir(), "none")
	_, err := NewDB(tokenEndpoint(t, db.URL, &TokenAuth{File: missing}), Options{Tokens: &TokenOptions{AllowCommands: true, Cache: NewTokens()}}).Info(ctx)
	if !errors.Is(err, ErrCredentials) || !strings.Contains(err.Error(), "auth.bearer.token_file "+missing+": no such file") {
		t.Fatalf("a missing token file: %v", err)
	}
}

func TestParseTokenOutput(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	jwt := testserver.SignJWT([]byte("k"), map[string]any{"exp": 1_700_000_060})
	for _, tc := range []struct {
		in      string
		tok     string
		expires int64
		err     string
	}{
		{`{"token":"abc","expires_at":1700000100}`, "abc", 1_700_000_100, ""},
		{`{"token":"abc","expires_at":"2023-11-14T22:15:00Z"}`, "abc", 1_700_000_100, ""},
		{"  abc\n", "abc", 0, ""},
		{jwt + "\n", jwt, 1_700_000_060, ""},
		{`{"token":"` + jwt + `"}`, jwt, 1_700_000_060, ""},
		{"", "", 0, "empty"},
		{`{"expires_at":1}`, "", 0, `no "token"`},
		{`{"token":"a","expires_at":true}`, "", 0, "expires_at"},
		{"a b", "", 0, "one word"},
	} {
		got, err := parseTokenOutput([]byte(tc.in), now)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got.value != tc.tok || (tc.expires == 0) != got.expires.IsZero() || (tc.expires != 0 && got.expires.Unix() != tc.expires) {
			t.Errorf("%q: %+v %v, want %q expiring %d", tc.in, got, err, tc.tok, tc.expires)
		}
	}
}

func TestParseTokenAuth(t *testing.T) {
	for _, tc := range []struct {
		auth map[string]any
		want string // TokenAuth.String, or the error's text
	}{
		{map[string]any{"iam": map[string]any{"api_key": "k"}}, "iam(api_key=*****)"},
		{map[string]any{"bearer": map[string]any{"token_file": "/run/tok"}}, "bearer(token_file=/run/tok)"},
		{map[string]any{"bearer": map[string]any{"command": []any{"vault", "read"}}}, "bearer(command=vault ...)"},
		{map[string]any{"basic": map[string]any{"username": "u", "password": "p"}}, "none"},
		{map[string]any{"iam": map[string]any{"apikey": "k"}}, `field "auth.iam.api_key" must be a non-empty string`},
		{map[string]any{"iam": "k"}, `field "auth.iam" must be an object, got a string`},
		{map[string]any{"iam": map[string]any{"api_key": "k"}, "basic": map[string]any{}}, `one of "basic", "iam" and "bearer"`},
		{map[string]any{"bearer": map[string]any{"token_file": "tok"}}, `field "auth.bearer.token_file" must be an absolute file path`},
		{map[string]any{"bearer": map[string]any{"command": "vault read"}}, `field "auth.bearer.command" must be a non-empty array of strings`},
		{map[string]any{"bearer": map[string]any{"command": []any{}}}, `field "auth.bearer.command" must be a non-empty array`},
		{map[string]any{"bearer": map[string]any{}}, `"auth.bearer" must hold "token_file" or "command"`},
		{map[string]any{"bearer": map[string]any{"command": []any{"a"}, "token_file": "/t"}}, "not both"},
	} {
		a, err := ParseTokenAuth(tc.auth)
		got := a.String()
		if err != nil {
			if !errors.Is(err, ErrInvalidEndpoint) {
				t.Errorf("%v: %v does not wrap ErrInvalidEndpoint", tc.auth, err)
			}
			got = err.Error()
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("%v: %q, want %q", tc.auth, got, tc.want)
		}
	}
}
