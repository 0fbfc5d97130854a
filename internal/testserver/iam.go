package testserver

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// IAM is a fake IBM Cloud IAM token endpoint on a loopback listener, the
// issuer and checker of the bearer tokens of the expiring-credential tests:
//
//   - POST /identity/token with grant_type=urn:ibm:params:oauth:grant-type:apikey
//     and a known apikey answers IBM's JSON (access_token, expires_in,
//     expiration, token_type): an HS256 JWT valid for Lifetime;
//   - GET /mint?sub=NAME answers {"token", "expires_at"} (the output a
//     credential command prints), a token of the same kind;
//   - GET /check (nginx's auth_request) answers 204 with X-Token-Id when the
//     request's "Authorization: Bearer" token was issued here, is not
//     revoked and has not expired, else 401.
type IAM struct {
	// URL is the token endpoint ([replicator] iam_token_url).
	URL string
	// MintURL answers one token in a credential command's output form.
	MintURL string
	// CheckURL validates a bearer token (nginx auth_request).
	CheckURL string
	// Secret is the HMAC key the tokens are signed with.
	Secret []byte

	mu        sync.Mutex
	keys      map[string]bool
	lifetime  time.Duration
	status    int  // non-zero: the token endpoint answers this
	hang      bool // the token endpoint does not answer
	exchanges int
	issued    map[string]issuedToken // by token
	n         int
	srv       *http.Server
	unhang    chan struct{}
}

type issuedToken struct {
	id      int
	expires time.Time
	revoked bool
}

// StartIAM starts a fake IAM endpoint that accepts the API keys keys and
// issues tokens valid for lifetime.
func StartIAM(t testing.TB, lifetime time.Duration, keys ...string) *IAM {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testserver: iam: %v", err)
	}
	i := &IAM{Secret: []byte("couchrep-test-iam-secret"), keys: map[string]bool{}, lifetime: lifetime,
		issued: map[string]issuedToken{}, unhang: make(chan struct{})}
	for _, k := range keys {
		i.keys[k] = true
	}
	base := "http://" + ln.Addr().String()
	i.URL, i.MintURL, i.CheckURL = base+"/identity/token", base+"/mint", base+"/check"
	i.srv = &http.Server{Handler: http.HandlerFunc(i.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = i.srv.Serve(ln) }()
	t.Cleanup(func() {
		i.Hang(false)
		_ = i.srv.Close()
	})
	return i
}

// SetLifetime sets the lifetime of the tokens issued from now on.
func (i *IAM) SetLifetime(d time.Duration) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.lifetime = d
}

// Fail makes the token endpoint answer status (400, 500...); 0 makes it
// issue tokens again.
func (i *IAM) Fail(status int) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.status = status
}

// Hang makes the token endpoint hold its requests without answering
// (until Hang(false)).
func (i *IAM) Hang(on bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if on == i.hang {
		return
	}
	i.hang = on
	if on {
		i.unhang = make(chan struct{})
	} else {
		close(i.unhang)
	}
}

// Exchanges is how many API-key exchanges the token endpoint answered
// (successful or not).
func (i *IAM) Exchanges() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.exchanges
}

// Issued is how many tokens were issued (exchanges and mints).
func (i *IAM) Issued() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.n
}

// RevokeAll makes every token issued so far invalid.
func (i *IAM) RevokeAll() {
	i.mu.Lock()
	defer i.mu.Unlock()
	for k, v := range i.issued {
		v.revoked = true
		i.issued[k] = v
	}
}

// Tokens returns every token issued so far (to check they appear nowhere).
func (i *IAM) Tokens() []string {
	i.mu.Lock()
	defer i.mu.Unlock()
	out := make([]string, 0, len(i.issued))
	for k := range i.issued {
		out = append(out, k)
	}
	return out
}

// Mint issues a token for sub valid for lifetime (i.mu is held).
func (i *IAM) mintLocked(sub string, lifetime time.Duration) (string, time.Time) {
	i.n++
	now := time.Now()
	exp := now.Add(lifetime)
	tok := SignJWT(i.Secret, map[string]any{"sub": sub, "iat": now.Unix(), "exp": float64(exp.UnixMilli()) / 1000, "jti": i.n})
	i.issued[tok] = issuedToken{id: i.n, expires: exp}
	return tok, exp
}

// SignJWT returns an HS256 JWT of claims signed with secret (CouchDB's
// jwt_authentication_handler with [jwt_keys] hmac:_default accepts it).
func SignJWT(secret []byte, claims map[string]any) string {
	enc := base64.RawURLEncoding
	head := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	body, _ := json.Marshal(claims)
	msg := head + "." + enc.EncodeToString(body)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(msg))
	return msg + "." + enc.EncodeToString(mac.Sum(nil))
}

func (i *IAM) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/identity/token":
		i.token(w, r)
	case "/mint":
		i.mu.Lock()
		tok, exp := i.mintLocked(r.URL.Query().Get("sub"), i.lifetime)
		i.mu.Unlock()
		writeJSONBody(w, http.StatusOK, map[string]any{"token": tok, "expires_at": exp.Format(time.RFC3339Nano)})
	case "/check":
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		i.mu.Lock()
		it, known := i.issued[tok]
		i.mu.Unlock()
		if !ok || !known || it.revoked || !time.Now().Before(it.expires) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-Token-Id", fmt.Sprint(it.id))
		w.WriteHeader(http.StatusNoContent)
	default:
		http.NotFound(w, r)
	}
}

func (i *IAM) token(w http.ResponseWriter, r *http.Request) {
	i.mu.Lock()
	hang, unhang := i.hang, i.unhang
	i.mu.Unlock()
	if hang {
		select {
		case <-unhang:
		case <-r.Context().Done():
			return
		}
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	i.exchanges++
	if r.Method != http.MethodPost || r.ParseForm() != nil ||
		r.PostForm.Get("grant_type") != "urn:ibm:params:oauth:grant-type:apikey" {
		writeJSONBody(w, http.StatusBadRequest, map[string]any{"errorCode": "BXNIM0109E", "errorMessage": "Property missing or empty."})
		return
	}
	if i.status != 0 {
		writeJSONBody(w, i.status, map[string]any{"errorCode": "BXNIM0400E", "errorMessage": fmt.Sprintf("Test failure %d.", i.status)})
		return
	}
	if !i.keys[r.PostForm.Get("apikey")] {
		writeJSONBody(w, http.StatusBadRequest, map[string]any{"errorCode": "BXNIM0415E", "errorMessage": "Provided API key could not be found."})
		return
	}
	tok, exp := i.mintLocked("iam-apikey", i.lifetime)
	secs := int64(i.lifetime / time.Second)
	writeJSONBody(w, http.StatusOK, map[string]any{"access_token": tok, "refresh_token": "not_supported",
		"token_type": "Bearer", "expires_in": max(secs, 1), "expiration": exp.Unix()})
}

func writeJSONBody(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// TokenProxy is an nginx process in front of one PouchDB Server that lets
// through only requests with a valid bearer token: every request is first
// checked by the fake IAM (auth_request to IAM.CheckURL), refused with 401
// when the token is missing, unknown, revoked or expired, and passed on
// without its Authorization header (PouchDB Server runs without admins).
type TokenProxy struct {
	*Proc
	// URL is the server root ("http://127.0.0.1:<port>/").
	URL string
	// AccessLog is nginx's access log: a line per request,
	// `<addr> "<request line>" <status> tok=<token id|->`, the id the
	// fake IAM gave the token (never the token).
	AccessLog string
}

// Access returns the proxy's access log so far.
func (p *TokenProxy) Access() string {
	b, err := os.ReadFile(p.AccessLog)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// StartTokenProxy starts nginx checking bearer tokens with iam in front of
// upstream (a PouchDB Server root URL).
func StartTokenProxy(t testing.TB, iam *IAM, upstream string) *TokenProxy {
	t.Helper()
	bin := binary(t, "nginx")
	up, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	check, err := url.Parse(iam.CheckURL)
	if err != nil {
		t.Fatal(err)
	}
	return retryOnPort(t, "nginx token proxy", func(dir string, port int, addr string) (*TokenProxy, error) {
		args, err := nginxConf(dir, "", fmt.Sprintf(`events { worker_connections 1024; }
http {
	log_format couchrep '$remote_addr "$request" $status tok=$token_id';
%[5]s	upstream pouchdb { server %[2]s; keepalive 64; }
	upstream iam { server %[3]s; keepalive 8; }
	server {
		listen %[4]s;
		location = /_token_check {
			internal;
			proxy_pass http://iam/check;
			proxy_pass_request_body off;
			proxy_set_header Content-Length "";
			proxy_set_header Connection "";
		}
		location / {
			auth_request /_token_check;
			auth_request_set $token_id $upstream_http_x_token_id;
			proxy_set_header Authorization "";
			proxy_set_header Connection "";
			proxy_set_header Host $http_host;
			proxy_pass http://pouchdb;
		}
	}
}
`, dir, up.Host, check.Host, addr, nginxStreaming(dir)))
		if err != nil {
			return nil, err
		}
		p, err := startProc(t, "nginx", bin, dir, filepath.Join(dir, "error.log"), args, dialable(addr))
		if err != nil {
			return nil, err
		}
		return &TokenProxy{Proc: p, URL: "http://" + addr + "/", AccessLog: filepath.Join(dir, "access.log")}, nil
	})
}
