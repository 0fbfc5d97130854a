package httpapi_test

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/httpapi"
)

// TestHashPassword: HashPassword writes CouchDB's "-pbkdf2-" form, which
// PasswordMatches (and so CouchDB) accepts for the password only, with a
// fresh salt each time.
func TestHashPassword(t *testing.T) {
	h1, err := httpapi.HashPassword("s3cret")
	if err != nil {
		t.Fatal(err)
	}
	h2, _ := httpapi.HashPassword("s3cret")
	parts := strings.Split(strings.TrimPrefix(h1, "-pbkdf2-"), ",")
	if !strings.HasPrefix(h1, "-pbkdf2-") || len(parts) != 3 || len(parts[0]) != 40 || len(parts[1]) != 32 || parts[2] != strconv.Itoa(httpapi.PBKDF2Iterations) {
		t.Fatalf("hash %q is not -pbkdf2-<40 hex>,<32 hex salt>,<iterations>", h1)
	}
	if h1 == h2 {
		t.Fatal("two hashes of one password are equal: no fresh salt")
	}
	if !httpapi.PasswordMatches(h1, "s3cret") || httpapi.PasswordMatches(h1, "s3cret ") || httpapi.PasswordMatches(h1, "") {
		t.Fatal("the hash does not match exactly its password")
	}
}

// TestFailedLoginsRateLimited: after AuthFailureBurst failed logins a
// client gets 429 with Retry-After, even with the right password, while
// good logins never count.
func TestFailedLoginsRateLimited(t *testing.T) {
	e := newEnvWith(t, httpapi.Options{Admins: map[string]string{"admin": "pw"}, MaxBodyBytes: 64 << 10,
		AuthFailureBurst: 3, AuthFailureInterval: time.Hour})
	for i := 0; i < 5; i++ { // good logins and requests without credentials are not failures
		if r := e.get("/_scheduler/jobs", "admin", "pw"); r.status != 200 {
			t.Fatalf("good login %d: %d %s", i, r.status, r.body)
		}
		if r := e.get("/_scheduler/jobs"); r.status != 401 {
			t.Fatalf("no credentials %d: %d %s", i, r.status, r.body)
		}
	}
	for i := 0; i < 3; i++ {
		if r := e.get("/_scheduler/jobs", "admin", "guess"+strconv.Itoa(i)); r.status != 401 {
			t.Fatalf("failed login %d: %d %s", i, r.status, r.body)
		}
	}
	for _, auth := range [][]string{{"admin", "guess"}, {"admin", "pw"}} {
		r := e.get("/_scheduler/jobs", auth...)
		assertError(t, r, 429, "too_many_requests", "too many failed logins from 127.0.0.1: retry in")
		if r.header.Get("Retry-After") == "" {
			t.Fatal("429 without Retry-After")
		}
	}
	if r := e.get("/_up"); r.status != 200 {
		t.Fatalf("/_up while limited: %d", r.status)
	}
}

// TestCredentialsNeverShown: passwords in URLs, auth objects and
// Authorization headers of a replication appear in no answer of the API.
func TestCredentialsNeverShown(t *testing.T) {
	e := newEnv(t, nil)
	body := `{"source":{"url":"http://alice:pw-in-url@a.example:5984/src","headers":{"Authorization":"Basic YWxpY2U6cHctaW4taGVhZGVy"}},` +
		`"target":{"url":"http://b.example:5984/tgt","auth":{"basic":{"username":"bob","password":"pw-in-auth"}}},"continuous":true}`
	if _, err := e.store.AddTransient(t.Context(), []byte(body), ""); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/_scheduler/jobs", "/_scheduler/docs", "/_active_tasks", "/metrics"} {
		r := e.get(path)
		for _, secret := range []string{"pw-in-url", "pw-in-header", "pw-in-auth", "YWxpY2U6cHctaW4taGVhZGVy"} {
			if bytes.Contains(r.body, []byte(secret)) {
				t.Errorf("%s shows %q: %s", path, secret, r.body)
			}
		}
	}
}
