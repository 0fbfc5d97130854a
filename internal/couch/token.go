package couch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/couchrep/couchrep/internal/redact"
)

// Credentials that expire (token.go): an endpoint's "auth" may name, in
// place of a password, an IBM Cloud IAM API key (exchanged for a bearer
// token at the IAM token endpoint), a file holding a bearer token or a
// program printing one. The token is sent as "Authorization: Bearer", kept
// in one tokenSource per credential shared by every DB of the process that
// uses it (Tokens), renewed at 80 % of its lifetime without holding up the
// requests that still may use the old one, and once more when the server
// answers 401.

// DefaultIAMTokenURL is IBM Cloud's IAM token endpoint ([replicator]
// iam_token_url).
const DefaultIAMTokenURL = "https://iam.cloud.ibm.com/identity/token"

// DefaultCredentialCommandTimeout bounds one run of a credential command
// ([replicator] credential_command_timeout).
const DefaultCredentialCommandTimeout = 10 * time.Second

// iamGrantType is the grant of an API-key exchange.
const iamGrantType = "urn:ibm:params:oauth:grant-type:apikey"

// ErrCredentials: an endpoint's expiring credential could not be obtained
// (the IAM token endpoint refused the API key or failed, the token file
// cannot be read, the credential command failed, hung or is not allowed).
// The message names the auth field and never holds the credential.
var ErrCredentials = errors.New("couch: credentials unavailable")

// ErrCredentialCommandsDisabled: a token file or command was given on a
// node whose operator did not allow them ([replicator]
// allow_credential_commands). It wraps ErrCredentials.
var ErrCredentialCommandsDisabled = fmt.Errorf("%w: credential files and commands are disabled on this node", ErrCredentials)

// TokenAuth is an endpoint's expiring credential: exactly one of its fields
// is set. It holds a secret (IAMKey): String and GoString mask it.
type TokenAuth struct {
	// IAMKey is "auth": {"iam": {"api_key"}}: an IBM Cloud API key.
	IAMKey string `json:",omitempty"`
	// File is "auth": {"bearer": {"token_file"}}: a file of the node
	// holding the token, read again when it changes.
	File string `json:",omitempty"`
	// Command is "auth": {"bearer": {"command"}}: a program and its
	// arguments (no shell) printing the token.
	Command []string `json:",omitempty"`
}

// Field names the auth member the credential came from, for errors.
func (a *TokenAuth) Field() string {
	switch {
	case a == nil:
		return ""
	case a.IAMKey != "":
		return "auth.iam.api_key"
	case a.File != "":
		return "auth.bearer.token_file"
	default:
		return "auth.bearer.command"
	}
}

// Local reports whether the credential reads a file or runs a program of
// the node (allowed only with TokenOptions.AllowCommands).
func (a *TokenAuth) Local() bool { return a != nil && a.IAMKey == "" }

// Object is the credential as the "auth" object of an endpoint.
func (a *TokenAuth) Object() map[string]any {
	switch {
	case a == nil:
		return nil
	case a.IAMKey != "":
		return map[string]any{"iam": map[string]any{"api_key": a.IAMKey}}
	case a.File != "":
		return map[string]any{"bearer": map[string]any{"token_file": a.File}}
	}
	argv := make([]any, len(a.Command))
	for i, s := range a.Command {
		argv[i] = s
	}
	return map[string]any{"bearer": map[string]any{"command": argv}}
}

// String names the credential without its secret.
func (a *TokenAuth) String() string {
	switch {
	case a == nil:
		return "none"
	case a.IAMKey != "":
		return "iam(api_key=" + redact.Mask + ")"
	case a.File != "":
		return "bearer(token_file=" + a.File + ")"
	}
	if len(a.Command) == 0 {
		return "bearer(command=[])"
	}
	return "bearer(command=" + a.Command[0] + " ...)"
}

// GoString is String, so %#v never prints the API key.
func (a *TokenAuth) GoString() string { return a.String() }

// ParseTokenAuth reads the expiring credential of an endpoint's "auth"
// object (as decoded from JSON): its "iam" or "bearer" member; nil when it
// has neither. Errors name the field relative to the endpoint
// ("auth.iam.api_key") and wrap ErrInvalidEndpoint; an "auth" with two
// credentials (basic, iam, bearer) is refused.
func ParseTokenAuth(auth map[string]any) (*TokenAuth, error) {
	iam, hasIAM := auth["iam"]
	bearer, hasBearer := auth["bearer"]
	hasIAM, hasBearer = hasIAM && iam != nil, hasBearer && bearer != nil
	if !hasIAM && !hasBearer {
		return nil, nil
	}
	basic, hasBasic := auth["basic"]
	if n := btoi(hasIAM) + btoi(hasBearer) + btoi(hasBasic && basic != nil); n > 1 {
		return nil, authErr("auth", "must hold one of \"basic\", \"iam\" and \"bearer\", not several")
	}
	if hasIAM {
		m, ok := iam.(map[string]any)
		if !ok {
			return nil, authErr("auth.iam", "must be an object, got %s", jsonType(iam))
		}
		k, ok := m["api_key"].(string)
		if !ok || k == "" {
			return nil, authErr("auth.iam.api_key", "must be a non-empty string")
		}
		return &TokenAuth{IAMKey: k}, nil
	}
	m, ok := bearer.(map[string]any)
	if !ok {
		return nil, authErr("auth.bearer", "must be an object, got %s", jsonType(bearer))
	}
	file, hasFile := m["token_file"]
	cmd, hasCmd := m["command"]
	switch {
	case hasFile && hasCmd:
		return nil, authErr("auth.bearer", "must hold one of \"token_file\" and \"command\", not both")
	case hasFile:
		f, ok := file.(string)
		if !ok || f == "" || !strings.HasPrefix(f, "/") {
			return nil, authErr("auth.bearer.token_file", "must be an absolute file path")
		}
		return &TokenAuth{File: f}, nil
	case hasCmd:
		list, ok := cmd.([]any)
		if !ok || len(list) == 0 {
			return nil, authErr("auth.bearer.command", "must be a non-empty array of strings (the program and its arguments)")
		}
		argv := make([]string, len(list))
		for i, v := range list {
			s, ok := v.(string)
			if !ok || (i == 0 && s == "") {
				return nil, authErr("auth.bearer.command", "must be a non-empty array of strings (the program and its arguments)")
			}
			argv[i] = s
		}
		return &TokenAuth{Command: argv}, nil
	}
	return nil, authErr("auth.bearer", "must hold \"token_file\" or \"command\"")
}

// AuthFieldError is an invalid member of an endpoint's "auth" object. It
// wraps ErrInvalidEndpoint.
type AuthFieldError struct {
	// Field is the member, relative to the endpoint ("auth.iam.api_key").
	Field string
	// Reason says what is wrong ("must be a non-empty string").
	Reason string
}

func (e *AuthFieldError) Error() string {
	return fmt.Sprintf("%s: field %q %s", ErrInvalidEndpoint, e.Field, e.Reason)
}

// Unwrap returns ErrInvalidEndpoint.
func (e *AuthFieldError) Unwrap() error { return ErrInvalidEndpoint }

func authErr(field, format string, a ...any) error {
	return &AuthFieldError{Field: field, Reason: fmt.Sprintf(format, a...)}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TokenOptions are the node's settings for expiring credentials
// (Options.Tokens). The zero value is IBM's IAM endpoint, credential files
// and commands refused.
type TokenOptions struct {
	// IAMURL is [replicator] iam_token_url; empty is DefaultIAMTokenURL.
	IAMURL string
	// AllowCommands is [replicator] allow_credential_commands: without it
	// a token file or command fails with ErrCredentialCommandsDisabled.
	AllowCommands bool
	// CommandTimeout bounds one run of a credential command (and one
	// exchange at the IAM endpoint); zero is DefaultCredentialCommandTimeout.
	CommandTimeout time.Duration
	// Client sends the IAM exchanges; nil is a client verifying the
	// endpoint's certificate against the system's roots.
	Client *http.Client
	// Cache shares the tokens; nil is the process's (DefaultTokens).
	Cache *Tokens
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
}

// Tokens holds the expiring credentials of a process: one token source
// per credential (API key and IAM endpoint, token file, command), shared
// by every DB that uses it, so N jobs with one API key make one exchange
// per renewal, not N. A source unused for an hour is dropped. Safe for
// concurrent use.
type Tokens struct {
	mu        sync.Mutex
	m         map[[sha256.Size]byte]*tokenSource
	lastSweep time.Time
}

// NewTokens returns an empty Tokens.
func NewTokens() *Tokens { return &Tokens{m: map[[sha256.Size]byte]*tokenSource{}} }

// DefaultTokens is the process's Tokens (TokenOptions.Cache nil).
var DefaultTokens = NewTokens()

// tokenIdle is how long an unused token source is kept.
const tokenIdle = time.Hour

func (ts *Tokens) get(key [sha256.Size]byte, now time.Time, mk func() *tokenSource) *tokenSource {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if now.Sub(ts.lastSweep) > time.Minute {
		ts.lastSweep = now
		for k, s := range ts.m {
			if s.idleSince(now) > tokenIdle {
				delete(ts.m, k)
			}
		}
	}
	if s := ts.m[key]; s != nil {
		return s
	}
	s := mk()
	ts.m[key] = s
	return s
}

// len is how many sources are held (tests).
func (ts *Tokens) len() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.m)
}

// Token-source timing.
const (
	// tokenRenewAt is the share of a token's lifetime after which it is
	// renewed (in the background: requests keep using it meanwhile).
	tokenRenewAt = 0.8
	// tokenForcedEvery bounds renewals forced by 401 answers: one per
	// credential this often; a 401 for a token renewed more recently stands.
	tokenForcedEvery = 5 * time.Second
	// tokenFileCheck is how often a token file is looked at (stat) while
	// it is in use.
	tokenFileCheck = time.Second
	// tokenRetryMin and tokenRetryMax bound the wait after a failed
	// renewal before the next one (doubling): however many jobs use the
	// credential, a failing IAM endpoint or command is asked this rarely.
	tokenRetryMin, tokenRetryMax = time.Second, time.Minute
	// maxTokenBytes bounds an IAM answer, a command's output, a token file.
	maxTokenBytes = 64 << 10
)

// token is one obtained credential.
type token struct {
	value    string
	obtained time.Time
	expires  time.Time // zero: unknown (used until refused)
	version  string    // token file: what its stat said when read
}

// expired reports whether t may no longer be sent at now: past its expiry,
// less a slack of 5 % of its lifetime (at most 5 s) for clock skew and
// requests in flight.
func (t token) expired(now time.Time) bool {
	if t.value == "" {
		return true
	}
	if t.expires.IsZero() {
		return false
	}
	slack := min(t.expires.Sub(t.obtained)/20, 5*time.Second)
	return !now.Before(t.expires.Add(-slack))
}

// tokenSource is one credential's token: obtained, renewed, refused.
type tokenSource struct {
	field   string // "auth.iam.api_key", ...
	fetch   func(ctx context.Context, prev token) (token, error)
	timeout time.Duration
	check   time.Duration // >0: renew this often (token files)
	now     func() time.Time

	mu       sync.Mutex
	cur      token
	epoch    int           // bumped when the token changes
	renewAt  time.Time     // zero: not before a 401
	inflight chan struct{} // closed when the running renewal ends
	err      error         // the last renewal's failure
	failures int
	retryAt  time.Time // no renewal before (after a failure)
	forcedAt time.Time // the last renewal a 401 forced
	lastUse  time.Time
}

// newTokenSource returns the shared source of a's token under o, or an
// error when a is not allowed (a token file or command without
// AllowCommands).
func newTokenSource(a *TokenAuth, o *TokenOptions) (*tokenSource, error) {
	var opts TokenOptions
	if o != nil {
		opts = *o
	}
	if a.Local() && !opts.AllowCommands {
		return nil, fmt.Errorf("%w: %s is not allowed: an administrator allows it with [replicator] allow_credential_commands = true",
			ErrCredentialCommandsDisabled, a.Field())
	}
	if opts.IAMURL == "" {
		opts.IAMURL = DefaultIAMTokenURL
	}
	if opts.CommandTimeout <= 0 {
		opts.CommandTimeout = DefaultCredentialCommandTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	cache := opts.Cache
	if cache == nil {
		cache = DefaultTokens
	}
	s := &tokenSource{field: a.Field(), timeout: opts.CommandTimeout, now: opts.Now}
	var id string
	switch {
	case a.IAMKey != "":
		client := opts.Client
		if client == nil {
			client = defaultClient()
		}
		id = fmt.Sprintf("iam\x00%s\x00%s", opts.IAMURL, a.IAMKey)
		s.fetch = iamFetch(client, opts.IAMURL, a.IAMKey, s.field, opts.Now)
	case a.File != "":
		id = "file\x00" + a.File
		s.fetch, s.check = fileFetch(a.File, s.field, opts.Now), tokenFileCheck
	default:
		id = fmt.Sprintf("command\x00%d\x00%s", opts.CommandTimeout, strings.Join(a.Command, "\x00"))
		s.fetch = commandFetch(a.Command, s.field, opts.CommandTimeout, opts.Now)
	}
	// The key is a digest: the API key stays out of the map's keys.
	return cache.get(sha256.Sum256([]byte(id)), opts.Now(), func() *tokenSource { return s }), nil
}

func (s *tokenSource) idleSince(now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inflight != nil {
		return 0
	}
	return now.Sub(s.lastUse)
}

// authorize sets req's Authorization to the current token, waiting for one
// when there is none (or it expired); a token due for renewal is renewed
// in the background. It returns the token's epoch for handle.
func (s *tokenSource) authorize(ctx context.Context, req *http.Request) (int, error) {
	for {
		s.mu.Lock()
		now := s.now()
		s.lastUse = now
		if !s.cur.expired(now) {
			if !s.renewAt.IsZero() && !now.Before(s.renewAt) && !now.Before(s.retryAt) {
				s.renewLocked()
			}
			v, epoch := s.cur.value, s.epoch
			s.mu.Unlock()
			req.Header.Set("Authorization", "Bearer "+v)
			return epoch, nil
		}
		if s.err != nil && now.Before(s.retryAt) {
			err := s.err
			s.mu.Unlock()
			return 0, err
		}
		done := s.renewLocked()
		s.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		}
	}
}

// renewLocked starts a renewal unless one runs (s.mu is held) and returns
// the channel closed when it ends. The renewal has its own deadline, not a
// request's: a request that gives up does not end it for the others.
func (s *tokenSource) renewLocked() <-chan struct{} {
	if s.inflight != nil {
		return s.inflight
	}
	done := make(chan struct{})
	s.inflight = done
	prev := s.cur
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout+time.Second)
		t, err := s.fetch(ctx, prev)
		cancel()
		s.mu.Lock()
		s.finishLocked(t, err)
		s.inflight = nil
		s.mu.Unlock()
		close(done)
	}()
	return done
}

// finishLocked records a renewal's outcome (s.mu is held).
func (s *tokenSource) finishLocked(t token, err error) {
	now := s.now()
	if err == nil && t.expired(now) {
		err = fmt.Errorf("%w: %s: the token obtained has already expired (at %s)", ErrCredentials, s.field, t.expires.UTC().Format(time.RFC3339))
	}
	if err != nil {
		s.err = err
		s.failures++
		wait := tokenRetryMin << min(s.failures-1, 6)
		s.retryAt = now.Add(min(wait, tokenRetryMax))
		return
	}
	if t.value != s.cur.value {
		s.epoch++
	}
	s.cur, s.err, s.failures, s.retryAt = t, nil, 0, time.Time{}
	switch {
	case s.check > 0:
		s.renewAt = now.Add(s.check)
	case t.expires.IsZero():
		s.renewAt = time.Time{}
	default:
		s.renewAt = t.obtained.Add(time.Duration(float64(t.expires.Sub(t.obtained)) * tokenRenewAt))
	}
}

// handle looks at the answer to a request sent with epoch's token: a 401
// renews the token (at most once per tokenForcedEvery) and asks for the
// request to be sent again; a 401 to an older token is retried with the
// current one at once.
func (s *tokenSource) handle(code int, epoch int) (retry bool) {
	if code != http.StatusUnauthorized {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if epoch < s.epoch {
		return true
	}
	now := s.now()
	if !s.forcedAt.IsZero() && now.Sub(s.forcedAt) < tokenForcedEvery {
		return false
	}
	s.forcedAt = now
	s.cur.expires, s.cur.obtained = now, now.Add(-time.Second) // refused: expired now
	s.retryAt = time.Time{}
	s.cur.version = "" // a token file is read again even if unchanged
	return true
}

// iamFetch exchanges key for a token at the IAM endpoint tokenURL.
func iamFetch(client *http.Client, tokenURL, key, field string, now func() time.Time) func(context.Context, token) (token, error) {
	shown := redact.URL(tokenURL)
	return func(ctx context.Context, _ token) (token, error) {
		body := url.Values{"grant_type": {iamGrantType}, "apikey": {key}}.Encode()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, tokenURL, strings.NewReader(body))
		if err != nil {
			return token{}, fmt.Errorf("%w: %s: bad IAM token endpoint %s", ErrCredentials, field, shown)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Accept", "application/json")
		req.Header.Set("User-Agent", userAgent)
		start := now()
		resp, err := client.Do(req)
		if err != nil {
			// The transport's error names the URL, never the form body.
			return token{}, fmt.Errorf("%w: %s: the IAM token endpoint %s could not be reached: %s", ErrCredentials, field, shown, redact.Text(err.Error()))
		}
		defer drain(resp)
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenBytes))
		if err != nil {
			return token{}, fmt.Errorf("%w: %s: reading the answer of the IAM token endpoint %s: %s", ErrCredentials, field, shown, redact.Text(err.Error()))
		}
		if resp.StatusCode != http.StatusOK {
			return token{}, fmt.Errorf("%w: %s: the IAM token endpoint %s refused the API key: %d%s",
				ErrCredentials, field, shown, resp.StatusCode, iamReason(b))
		}
		var a struct {
			AccessToken string      `json:"access_token"`
			ExpiresIn   json.Number `json:"expires_in"`
			Expiration  json.Number `json:"expiration"`
		}
		if json.Unmarshal(b, &a) != nil || a.AccessToken == "" {
			return token{}, fmt.Errorf("%w: %s: the IAM token endpoint %s answered without an access_token", ErrCredentials, field, shown)
		}
		t := token{value: a.AccessToken, obtained: start}
		if n, err := a.ExpiresIn.Int64(); err == nil && n > 0 {
			t.expires = start.Add(time.Duration(n) * time.Second)
		} else if n, err := a.Expiration.Int64(); err == nil && n > 0 {
			t.expires = time.Unix(n, 0)
		} else {
			t.expires = jwtExpiry(a.AccessToken)
		}
		return t, nil
	}
}

// iamReason is the errorCode and errorMessage of an IAM error answer (no
// secret in them), or its first 200 bytes redacted.
func iamReason(b []byte) string {
	var e struct {
		Code    string `json:"errorCode"`
		Message string `json:"errorMessage"`
	}
	if json.Unmarshal(b, &e) == nil && (e.Code != "" || e.Message != "") {
		return " " + strings.TrimSpace(e.Code+" "+redact.Text(e.Message))
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return ""
	}
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return " " + redact.Text(s)
}

// fileFetch reads the token file path when it changed since prev was read
// (its size, modification time or inode).
func fileFetch(path, field string, now func() time.Time) func(context.Context, token) (token, error) {
	return func(_ context.Context, prev token) (token, error) {
		st, err := os.Stat(path)
		if err != nil {
			return token{}, fmt.Errorf("%w: %s %s: %s", ErrCredentials, field, path, pathError(err))
		}
		version := fmt.Sprintf("%d/%d/%d", st.Size(), st.ModTime().UnixNano(), inode(st))
		if prev.value != "" && prev.version == version {
			return prev, nil
		}
		f, err := os.Open(path)
		if err != nil {
			return token{}, fmt.Errorf("%w: %s %s: %s", ErrCredentials, field, path, pathError(err))
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, maxTokenBytes+1))
		if err != nil {
			return token{}, fmt.Errorf("%w: %s %s: %s", ErrCredentials, field, path, pathError(err))
		}
		t, err := parseTokenOutput(b, now())
		if err != nil {
			return token{}, fmt.Errorf("%w: %s %s: %w", ErrCredentials, field, path, err)
		}
		t.version = version
		return t, nil
	}
}

// pathError is err's reason without the path (the caller names it).
func pathError(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

func inode(st os.FileInfo) uint64 {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return s.Ino
	}
	return 0
}

// commandFetch runs argv (no shell, no stdin, the node's environment) and
// reads the token from its output; a run longer than timeout is killed
// with its process group.
func commandFetch(argv []string, field string, timeout time.Duration, now func() time.Time) func(context.Context, token) (token, error) {
	prog := argv[0]
	return func(ctx context.Context, prev token) (token, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		var stdout, stderr limitedBuffer
		stdout.n, stderr.n = maxTokenBytes+1, 4<<10
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = time.Second
		start := now()
		err := cmd.Run()
		switch {
		case ctx.Err() == context.DeadlineExceeded:
			return token{}, fmt.Errorf("%w: %s: %s did not finish within %s and was killed", ErrCredentials, field, prog, timeout)
		case err != nil:
			why := err.Error()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				why = ee.ProcessState.String()
			}
			if line := lastLine(stderr.String(), prev.value); line != "" {
				why += ": " + line
			}
			return token{}, fmt.Errorf("%w: %s: %s failed: %s", ErrCredentials, field, prog, why)
		}
		t, err := parseTokenOutput(stdout.Bytes(), start)
		if err != nil {
			return token{}, fmt.Errorf("%w: %s: the output of %s: %w", ErrCredentials, field, prog, err)
		}
		return t, nil
	}
}

// lastLine is s's last non-empty line, at most 200 bytes, redacted (and
// without secret, the previous token, should the program print it).
func lastLine(s, secret string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = strings.TrimSpace(s[i+1:])
	}
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	if secret != "" {
		s = strings.ReplaceAll(s, secret, redact.Mask)
	}
	return redact.Text(s)
}

// limitedBuffer keeps the first n bytes written to it.
type limitedBuffer struct {
	bytes.Buffer
	n int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.n - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// parseTokenOutput reads a token file's content or a command's output:
// {"token": ..., "expires_at": ...} (expires_at in Unix seconds or RFC
// 3339), or the raw token (a JWT's exp claim is its expiry).
func parseTokenOutput(b []byte, obtained time.Time) (token, error) {
	if len(b) > maxTokenBytes {
		return token{}, fmt.Errorf("more than %d bytes", maxTokenBytes)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return token{}, errors.New("no token (empty)")
	}
	t := token{obtained: obtained}
	if s[0] == '{' {
		var o struct {
			Token     string          `json:"token"`
			ExpiresAt json.RawMessage `json:"expires_at"`
		}
		if err := json.Unmarshal([]byte(s), &o); err != nil {
			return token{}, errors.New("not a JSON object with a string \"token\"")
		}
		if o.Token == "" {
			return token{}, errors.New("no \"token\" in the JSON object")
		}
		t.value = o.Token
		exp, err := parseExpiresAt(o.ExpiresAt)
		if err != nil {
			return token{}, err
		}
		t.expires = exp
	} else {
		if strings.ContainsAny(s, " \t\r\n") {
			return token{}, errors.New("not a token: a raw token is one word (or print {\"token\": ..., \"expires_at\": ...})")
		}
		t.value = s
	}
	if t.expires.IsZero() {
		t.expires = jwtExpiry(t.value)
	}
	if strings.ContainsAny(t.value, "\r\n") {
		return token{}, errors.New("the token holds a line break")
	}
	return t, nil
}

// parseExpiresAt reads "expires_at": Unix seconds or an RFC 3339 time;
// absent or null is unknown (zero).
func parseExpiresAt(raw json.RawMessage) (time.Time, error) {
	r := strings.TrimSpace(string(raw))
	if r == "" || r == "null" {
		return time.Time{}, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		f, err := strconv.ParseFloat(string(n), 64)
		if err == nil && f > 0 {
			return time.Unix(0, int64(f*1e9)), nil
		}
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errors.New("\"expires_at\" must be Unix seconds or an RFC 3339 time")
}

// jwtExpiry is the exp claim of a JWT (zero when tok is not one or has
// none).
func jwtExpiry(tok string) time.Time {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return time.Time{}
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}
	}
	var c struct {
		Exp json.Number `json:"exp"`
	}
	if json.Unmarshal(b, &c) != nil {
		return time.Time{}
	}
	f, err := strconv.ParseFloat(string(c.Exp), 64)
	if err != nil || f <= 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(f*1e9))
}
