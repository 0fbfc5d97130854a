package redact

import (
	"fmt"
	"strings"
	"testing"
)

// TestRedact: no credential form survives Redact (free text) or RedactURL
// (one URL): userinfo of endpoint, proxy and store URLs, auth.basic and
// BasicPass, password settings, Authorization and Cookie headers and
// AuthSession cookies. Each secret contains "s3cr3t"; want, when set, is the
// exact answer (the user name and the rest stay readable).
func TestRedact(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		url            bool // RedactURL, else Redact
	}{
		{"endpoint userinfo", "http://bob:s3cr3t@a.example:5984/db/", "http://bob:*****@a.example:5984/db/", true},
		{"escaped password", "http://bob:s3%20cr3t@a.example/db?x=1", "http://bob:*****@a.example/db?x=1", true},
		{"@ in password", "http://bob:p@s3cr3t@a.example/db", "http://bob:*****@a.example/db", true},
		{"unparsable URL", "http://bob:s3cr3t x@a b/db", "http://*****@a b/db", true},
		{"user only", "http://bob@a.example/db", "http://bob@a.example/db", true},
		{"no credentials", "http://a.example/db", "http://a.example/db", true},
		{"bare name", "mydb", "mydb", true},
		{"proxy userinfo", "socks5://pu:s3cr3t@proxy:1080", "socks5://pu:*****@proxy:1080", true},
		{"store URL", "postgres://couchrep:s3cr3t@db:5432/couchrep?sslmode=disable", "postgres://couchrep:*****@db:5432/couchrep?sslmode=disable", true},
		{"store URL password parameter", "postgres://couchrep@db/couchrep?password=s3cr3t&sslmode=disable", "postgres://couchrep@db/couchrep?password=*****&sslmode=disable", true},
		{"store key=value", "host=db user=couchrep password=s3cr3t dbname=x", "host=db user=couchrep password=***** dbname=x", true},
		{"store key=value quoted", "host=db password='s3cr3t and more' dbname=x", "host=db password='*****' dbname=x", false},
		{"error with URL", "could not open http://u:s3cr3t@h:5984/db/: refused", "could not open http://u:*****@h:5984/db/: refused", false},
		{"JSON endpoint", `{"source":"https://admin:s3cr3t%40y@host/db"}`, `{"source":"https://admin:*****@host/db"}`, false},
		{"auth.basic", `{"url":"http://h/db","auth":{"basic":{"username":"bob","password":"s3cr3t"}}}`, `{"url":"http://h/db","auth":{"basic":{"username":"bob","password":"*****"}}}`, false},
		{"BasicPass printed", fmt.Sprintf("%+v", struct{ BasicUser, BasicPass string }{"bob", "s3cr3t"}), "{BasicUser:bob BasicPass:*****}", false},
		{"Authorization Basic", "Authorization: Basic s3cr3tdXNlcjpwYXNz", "Authorization: Basic *****", false},
		{"Authorization Bearer JSON", `{"headers":{"Authorization":"Bearer s3cr3t.tok"}}`, `{"headers":{"Authorization":"Bearer *****"}}`, false},
		{"Proxy-Authorization", "Proxy-Authorization=Basic s3cr3t", "Proxy-Authorization=Basic *****", false},
		{"Cookie header", "Cookie: AuthSession=s3cr3t; other=s3cr3t2", "Cookie: *****", false},
		{"Set-Cookie JSON", `{"Set-Cookie":"AuthSession=s3cr3t; Path=/"}`, `{"Set-Cookie":"*****"}`, false},
		{"AuthSession in text", "session AuthSession=s3cr3t expired", "session AuthSession=***** expired", false},
		{"auth.iam", `{"url":"https://acct.cloudant.com/db","auth":{"iam":{"api_key":"s3cr3t-Key_1"}}}`, `{"url":"https://acct.cloudant.com/db","auth":{"iam":{"api_key":"*****"}}}`, false},
		{"IAM form", "grant_type=urn:ibm:params:oauth:grant-type:apikey&apikey=s3cr3t", "grant_type=urn:ibm:params:oauth:grant-type:apikey&apikey=*****", false},
		{"IAM answer", `{"access_token":"s3cr3t.x.y","refresh_token":"s3cr3t2","token_type":"Bearer","expires_in":3600}`, `{"access_token":"*****","refresh_token":"*****","token_type":"Bearer","expires_in":3600}`, false},
		{"command output", `{"token":"s3cr3t","expires_at":1700000000}`, `{"token":"*****","expires_at":1700000000}`, false},
		{"bearer in text", "sent Bearer s3cr3t.abc/def= to h", "sent Bearer ***** to h", false},
		{"JWT in text", "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJzM2NyM3QifQ.s3cr3tsig refused", "token ***** refused", false},
		{"field names kept", `auth.iam.api_key: the IAM token endpoint http://h/identity/token refused the API key; Post "http://h/identity/token": context deadline exceeded`, `auth.iam.api_key: the IAM token endpoint http://h/identity/token refused the API key; Post "http://h/identity/token": context deadline exceeded`, false},
		{"token file path kept", `{"bearer":{"token_file":"/run/secrets/tok"}}`, `{"bearer":{"token_file":"/run/secrets/tok"}}`, false},
		{"no secrets", "no secrets here http://h/db: password authentication failed", "no secrets here http://h/db: password authentication failed", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Text(tc.in)
			if tc.url {
				got = URL(tc.in)
			}
			if strings.Contains(got, "s3cr3t") {
				t.Fatalf("credential survived: %q -> %q", tc.in, got)
			}
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			if again := Text(got); again != got {
				t.Errorf("redacting twice changes it: %q -> %q", got, again)
			}
		})
	}
}

// TestStripUserinfo: the identity form of an endpoint URL (hashed into job
// ids) drops the whole userinfo and nothing else.
func TestStripUserinfo(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"http://bob:s3cr3t@a.example:5984/db/", "http://a.example:5984/db/"},
		{"http://bob@a.example/db", "http://a.example/db"},
		{"http://a.example/db/x@y", "http://a.example/db/x@y"},
		{"http://u:p@ss@h/db", "http://h/db"},
		{"mydb", "mydb"},
	} {
		if got := StripUserinfo(tc.in); got != tc.want {
			t.Errorf("StripUserinfo(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// BenchmarkRedact: the cost Redact adds to a log line without credentials
// (the common case, a prefilter) and with one.
func BenchmarkRedact(b *testing.B) {
	for _, bc := range []struct{ name, line string }{
		{"clean", `{"level":"info","job_id":"3b2e7f","url":"http://h:5984/db/_changes?feed=normal&since=12","time":"2026-01-01T00:00:00Z","message":"checkpoint written"}`},
		{"secret", `{"level":"warn","url":"http://bob:s3cr3t@h:5984/db/","error":"Authorization: Basic abc","message":"request failed"}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				_ = Text(bc.line)
			}
		})
	}
}
