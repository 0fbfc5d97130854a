package couch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/couchrep/couchrep/internal/pause"
	"github.com/couchrep/couchrep/internal/redact"
	"github.com/rs/zerolog"
)

// Defaults, as in CouchDB's replicator.
const (
	// DefaultRetries is CouchDB's retries_per_request.
	DefaultRetries = 5
	// DefaultRetryBackoff is the first wait before a retry; it doubles each time.
	DefaultRetryBackoff = 250 * time.Millisecond
	// DefaultMaxRetryBackoff caps the doubling (CouchDB: 5 minutes).
	DefaultMaxRetryBackoff = 5 * time.Minute
)

// Options configure a DB. The zero value works: a default client, no
// logging, no retries, no rate limiter.
type Options struct {
	// HTTPClient sends the requests (the connection pool lives in its
	// Transport). nil means a shared client whose transport NewTransport
	// built with certificate verification on.
	HTTPClient *http.Client
	// Logger receives retry warnings. Credentials are never logged.
	Logger zerolog.Logger
	// Retries is retries_per_request: how many times a request that failed
	// with 408, 5xx or a connection error is sent again. 0 means never;
	// CouchDB's default is DefaultRetries.
	Retries int
	// RetryBackoff is the first wait before a retry (doubling each time);
	// 0 means DefaultRetryBackoff.
	RetryBackoff time.Duration
	// MaxRetryBackoff caps the wait; 0 means DefaultMaxRetryBackoff.
	MaxRetryBackoff time.Duration
	// Limiter, when set, is consulted before every request and told about
	// every 429 (which is then retried without using up a retry). When nil
	// a 429 is retried like a 5xx.
	Limiter Limiter
	// UserAgent overrides the User-Agent header ("couchrep/<version>").
	UserAgent string
	// Gzip asks for gzip-compressed responses (Accept-Encoding: gzip).
	// Off by default: CouchDB does not compress, and PouchDB Server's gzip
	// costs a third of the throughput on a loopback connection. A
	// compressed answer is decoded either way (compress.go).
	Gzip bool
	// CompressMinBytes sends _bulk_docs, _revs_diff and _bulk_get bodies
	// of at least this many bytes gzip-compressed (compress.go: a server
	// that refuses them gets them plain). Zero sends every body plain.
	CompressMinBytes int64
	// Session, when set and the endpoint has credentials, authenticates
	// with an AuthSession cookie from POST /_session instead of sending
	// Basic auth with every request (CouchDB's default auth plugins). Nil
	// sends Basic auth.
	Session *SessionOptions
	// Tokens are the node's settings for endpoints whose credential
	// expires (Endpoint.Token: an IAM API key, a token file or command);
	// nil is TokenOptions' zero value (IBM's IAM endpoint, files and
	// commands refused).
	Tokens *TokenOptions
	// ErrorBudget bounds the time one request spends failing and being
	// retried: once this long has passed since its first failure it is not
	// retried again, whatever Retries allows (CouchDB: half of
	// health_threshold, 60 s). Zero means no bound.
	ErrorBudget time.Duration
	// Limits bound what is read from the server: a read deadline and the
	// largest document, _changes row and whole response (see Limits).
	Limits Limits
	// RequestTimeout is request_timeout: it bounds each attempt of every
	// request except a _changes feed, from sending it until its whole
	// response body has been read (as ibrowse's request timeout in
	// couch_replicator_httpc:send_ibrowse_req). An attempt it ends fails
	// with an error matching ErrRequestTimeout and is retried like a
	// connection error (a response read whole is sent again as well).
	// Zero means no bound (CouchDB's infinity).
	RequestTimeout time.Duration
}

// LimitKey identifies what a Limiter limits: CouchDB keys its rate limiter
// by endpoint URL and method.
type LimitKey struct {
	// Endpoint is the redacted database URL.
	Endpoint string
	// Method is the HTTP method.
	Method string
}

// Limiter is the seam for the rate limiter (CouchDB's AIMD limiter on 429
// responses). Implementations must be safe for concurrent use.
type Limiter interface {
	// Wait blocks until a request for key may be sent. An error aborts the
	// request (it is returned wrapped); e.g. the limiter's maximum backoff
	// was reached.
	Wait(ctx context.Context, key LimitKey) error
	// Success records a response that was not a 429.
	Success(key LimitKey)
	// Failure records a 429 response.
	Failure(key LimitKey)
}

// DB is a client for one database. It is safe for concurrent use.
type DB struct {
	ep      Endpoint
	base    string // scheme://host/escaped/db/path/ (always a trailing slash, no query)
	server  string // scheme://host/escaped/server/root/
	red     string // redacted database URL, for errors and limiter keys
	opts    Options
	client  *http.Client
	log     zerolog.Logger
	headers http.Header  // shared: read only
	sess    *session     // nil: Basic auth (or none)
	tok     *tokenSource // the endpoint's expiring credential (Endpoint.Token)
	tokErr  error        // why tok could not be made: every request fails with it
	lim     Limits       // with defaults filled in
	// gzipRefused: the server refused a compressed request body; bodies
	// are sent plain from then on.
	gzipRefused atomic.Bool
}

// userAgent is sent unless Options.UserAgent says otherwise.
const userAgent = "couchrep/0.1"

// NewDB returns a client for the database at ep.
func NewDB(ep Endpoint, opts Options) *DB {
	d := &DB{ep: ep, opts: opts, client: opts.HTTPClient, log: opts.Logger, lim: opts.Limits.withDefaults()}
	if d.client == nil {
		d.client = defaultClient()
	}
	if d.opts.RetryBackoff <= 0 {
		d.opts.RetryBackoff = DefaultRetryBackoff
	}
	if d.opts.MaxRetryBackoff <= 0 {
		d.opts.MaxRetryBackoff = DefaultMaxRetryBackoff
	}
	if d.opts.Retries < 0 {
		d.opts.Retries = 0
	}
	if ep.URL != nil {
		u := *ep.URL
		u.User, u.RawQuery, u.ForceQuery, u.Fragment = nil, "", false, ""
		d.base = u.String()
		if !strings.HasSuffix(d.base, "/") {
			d.base += "/"
		}
		d.server = ep.ServerURL().String()
	}
	d.red = ep.Redacted()
	switch {
	case ep.Token != nil:
		// The token replaces any basic credentials: no session, no Basic.
		d.tok, d.tokErr = newTokenSource(ep.Token, opts.Tokens)
	case opts.Session != nil && ep.URL != nil && (ep.Username != "" || ep.Password != ""):
		d.sess = newSession(d, *opts.Session)
	}
	if (opts.UserAgent == "" || opts.UserAgent == userAgent) && !opts.Gzip && len(ep.Headers) == 0 {
		d.headers = defaultHeaders
		return d
	}
	d.headers = requestHeaders(opts, ep)
	return d
}

// defaultClient is the client of a DB without Options.HTTPClient: one
// transport of NewTransport's, certificates verified against the system's
// roots, built on first use.
var defaultClient = sync.OnceValue(func() *http.Client {
	tr, err := NewTransport(TransportOptions{TLS: TLSOptions{Verify: true, MaxDepth: -1}})
	if err != nil { // cannot happen: no file is read
		panic(err)
	}
	return &http.Client{Transport: tr}
})

// defaultHeaders are the headers of a DB with default Options and no
// endpoint headers, shared by all of them (never modified: send copies
// them into each request).
var defaultHeaders = requestHeaders(Options{}, Endpoint{})

// requestHeaders are the headers sent with every request of a DB.
func requestHeaders(opts Options, ep Endpoint) http.Header {
	h := http.Header{}
	h.Set("Accept", "application/json")
	ua := opts.UserAgent
	if ua == "" {
		ua = userAgent
	}
	h.Set("User-Agent", ua)
	// Setting the header also stops net/http from adding gzip and
	// decoding it itself: decodeBody does, under the client's limits.
	if opts.Gzip {
		h.Set("Accept-Encoding", "gzip")
	} else {
		h.Set("Accept-Encoding", "identity")
	}
	for k, vs := range ep.Headers {
		h[k] = append([]string(nil), vs...)
	}
	return h
}

// Endpoint returns the endpoint the DB talks to.
func (d *DB) Endpoint() Endpoint { return d.ep }

// String returns the redacted database URL.
func (d *DB) String() string { return d.red }

// request describes one HTTP request; it is rebuilt for every attempt.
type request struct {
	method string
	// path is the escaped path relative to the database URL ("" is the
	// database itself), or to the server root when root is set.
	path  string
	root  bool
	query string // encoded query string, without "?"
	// body returns a fresh reader over the same bytes for each attempt; nil for no body.
	body        func() io.Reader
	bodyLen     int64 // -1 when unknown
	contentType string
	accept      string
	// acceptEncoding overrides the Accept-Encoding header (attachments
	// asked for in their stored encoding).
	acceptEncoding string
	// okStatus accepts a non-2xx status as success (the caller reads the body).
	okStatus func(int) bool
	// noRetry disables retries (streaming feeds handle their own).
	noRetry bool
	// feed marks a _changes request: request_timeout does not bound it.
	feed bool
	// compress marks a body that may be sent gzip-compressed
	// (Options.CompressMinBytes); gz is the compressed body, made once,
	// gzNoGain records that it did not shrink, sentGzip that the current
	// attempt was sent compressed.
	compress, gzNoGain, sentGzip bool
	gz                           []byte
}

func (r *request) url(d *DB) string {
	base := d.base
	if r.root {
		base = d.server
	}
	s := base + r.path
	if r.query != "" {
		s += "?" + r.query
	}
	return s
}

// redactedURL is the request URL for errors and logs, through redact.URL;
// long query strings are shortened.
func (r *request) redactedURL(d *DB) string {
	s := r.url(d)
	if i := strings.IndexByte(s, '?'); i >= 0 && len(s)-i > 200 {
		s = s[:i+200] + "..."
	}
	return redact.URL(s)
}

func bytesBody(b []byte) (func() io.Reader, int64) {
	return func() io.Reader { return bytes.NewReader(b) }, int64(len(b))
}

func jsonBody(v any) (func() io.Reader, int64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, 0, fmt.Errorf("couch: encoding request: %w", err)
	}
	f, n := bytesBody(b)
	return f, n, nil
}

// do sends r with retries and returns the response when its status is 2xx
// (or accepted by r.okStatus); otherwise an *HTTPError or a wrapped
// transport error. The caller closes the body.
func (d *DB) do(ctx context.Context, r *request) (*http.Response, error) {
	return d.exchange(ctx, r, nil)
}

// doRead sends r with retries like do and hands a successful response to
// read, which consumes and closes it. When request_timeout or
// connection_timeout ends the read, or the connection is lost before the
// body's end (read's error matches ErrRequestTimeout, ErrStalled or
// errConnectionLost and is not a finalError) the request is sent again,
// within the same retries and error budget, as ibrowse's req_timedout and
// a closed connection are by couch_replicator_httpc.
func (d *DB) doRead(ctx context.Context, r *request, read func(*http.Response) error) error {
	_, err := d.exchange(ctx, r, read)
	return err
}

// finalError is a read error that must not be retried (the caller was
// already handed part of the answer).
type finalError struct{ err error }

func (f finalError) Error() string { return f.err.Error() }
func (f finalError) Unwrap() error { return f.err }

// exchange is do (read nil) and doRead.
func (d *DB) exchange(ctx context.Context, r *request, read func(*http.Response) error) (*http.Response, error) {
	key := LimitKey{Endpoint: d.red, Method: r.method}
	backoff := pause.Backoff{Min: d.opts.RetryBackoff, Max: d.opts.MaxRetryBackoff}
	wait := backoff.Next()
	retries := d.opts.Retries
	if r.noRetry {
		retries = 0
	}
	total := d.opts.RequestTimeout
	if r.feed {
		total = 0
	}
	var firstErr time.Time
	authRetries := 0
	for attempt := 0; ; {
		if lim := d.opts.Limiter; lim != nil {
			if err := lim.Wait(ctx, key); err != nil {
				return nil, fmt.Errorf("couch: %s %s: %w", r.method, r.redactedURL(d), err)
			}
		}
		rctx, dl := arm(ctx, d.lim.ReadTimeout, total)
		resp, epoch, err := d.send(rctx, r, dl)
		if err != nil {
			if ctx.Err() != nil {
				dl.release()
				return nil, fmt.Errorf("couch: %s %s: %w", r.method, r.redactedURL(d), context.Cause(ctx))
			}
			derr := dl.err(rctx, r.method, r.redactedURL(d), "waiting for the response headers")
			dl.release()
			if derr == nil && headerTimeout(err) {
				// The transport's ResponseHeaderTimeout (connection_timeout
				// too) fired before the read deadline: the same stall.
				derr = stallError(r.method, r.redactedURL(d), d.lim.ReadTimeout, "waiting for the response headers")
			}
			if derr != nil {
				err = derr
			} else {
				if ce, ok := AsCertificateError(err); ok {
					return nil, fmt.Errorf("couch: %s %s: %w", r.method, r.redactedURL(d), ce)
				}
				var herr *HTTPError
				if errors.As(err, &herr) || errors.Is(err, ErrSession) || errors.Is(err, ErrTransportConfig) {
					return nil, err // from the session plugin: final
				}
				if errors.Is(err, ErrCredentials) {
					// The token source paces its own renewals: final.
					return nil, fmt.Errorf("couch: %s %s: %w", r.method, r.redactedURL(d), err)
				}
				if errors.Is(err, ErrAttachmentMismatch) {
					// The request body's source lied: sending it again
					// would read the same bytes.
					return nil, fmt.Errorf("couch: %s %s: %w", r.method, r.redactedURL(d), err)
				}
				err = fmt.Errorf("couch: %s %s: %w", r.method, r.redactedURL(d), err)
			}
			if attempt >= retries || d.overBudget(&firstErr) {
				return nil, err
			}
			d.log.Warn().Str("method", r.method).Str("url", r.redactedURL(d)).Err(err).
				Int("attempt", attempt+1).Dur("wait", wait).Msg("couch: request failed, retrying")
		} else {
			code := resp.StatusCode
			if ((d.sess != nil && d.sess.handle(code, resp.Header, epoch)) || (d.tok != nil && d.tok.handle(code, epoch))) &&
				authRetries < maxAuthRetries {
				drain(resp)
				dl.release()
				authRetries++
				continue // the cookie was renewed (or is newer): send again at once
			}
			if code == http.StatusTooManyRequests && d.opts.Limiter != nil {
				drain(resp)
				dl.release()
				d.opts.Limiter.Failure(key)
				continue // a 429 does not use up a retry; the limiter paces us
			}
			if d.opts.Limiter != nil {
				d.opts.Limiter.Success(key)
			}
			if r.sentGzip && refusedEncoding(code) && d.gzipRefused.CompareAndSwap(false, true) {
				drain(resp)
				dl.release()
				d.log.Info().Str("method", r.method).Str("url", r.redactedURL(d)).Int("status", code).
					Msg("couch: the server refused a gzip-compressed request body; sending it and the next ones plain")
				continue // at once, plain, without using up a retry
			}
			if code/100 == 2 || (r.okStatus != nil && r.okStatus(code)) {
				resp.Body = &guardedBody{rc: resp.Body, ctx: rctx, dl: dl, method: r.method, url: r.redactedURL(d)}
				decodeBody(resp, r) // over the guarded body: the deadline counts the bytes received
				if read == nil {
					return resp, nil
				}
				err := read(resp)
				_ = resp.Body.Close()
				var final finalError
				switch {
				case err == nil:
					return nil, nil
				case errors.As(err, &final):
					return nil, final.err
				case !(errors.Is(err, ErrRequestTimeout) || errors.Is(err, ErrStalled) || errors.Is(err, errConnectionLost)) ||
					ctx.Err() != nil || attempt >= retries || d.overBudget(&firstErr):
					return nil, err
				}
				d.log.Warn().Str("method", r.method).Str("url", r.redactedURL(d)).Err(err).
					Int("attempt", attempt+1).Dur("wait", wait).Msg("couch: request failed, retrying")
			} else {
				decodeBody(resp, r)
				herr := readHTTPError(resp, r.method, r.redactedURL(d))
				dl.release()
				if !(retryableStatus(code) || code == http.StatusTooManyRequests) || attempt >= retries || d.overBudget(&firstErr) {
					return nil, herr
				}
				d.log.Warn().Str("method", r.method).Str("url", r.redactedURL(d)).Int("status", code).
					Str("error", herr.ErrorName).Str("reason", herr.Reason).
					Int("attempt", attempt+1).Dur("wait", wait).Msg("couch: request failed, retrying")
			}
		}
		if err := pause.For(ctx, wait); err != nil {
			return nil, fmt.Errorf("couch: %s %s: %w", r.method, r.redactedURL(d), err)
		}
		attempt++
		wait = backoff.Next()
	}
}

// headerTimeout reports whether err is net/http's "timeout awaiting
// response headers" (Transport.ResponseHeaderTimeout), which it does not
// export.
func headerTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() && strings.Contains(err.Error(), "timeout awaiting response headers")
}

// maxAuthRetries bounds how often one request is sent again because the
// session cookie was renewed.
const maxAuthRetries = 4

// overBudget reports whether the error budget of a request that first
// failed at *first is spent; it records the first failure.
func (d *DB) overBudget(first *time.Time) bool {
	if d.opts.ErrorBudget <= 0 {
		return false
	}
	now := time.Now()
	if first.IsZero() {
		*first = now
		return false
	}
	return now.Sub(*first) >= d.opts.ErrorBudget
}

// send sends one attempt of r; epoch is the session cookie's it carried.
// Every read of the request body that takes bytes pushes dl's read
// deadline back: a large upload is progress, as a response's bytes are.
func (d *DB) send(ctx context.Context, r *request, dl *deadline) (*http.Response, int, error) {
	var body io.Reader
	gz := d.compressedBody(r)
	r.sentGzip = gz != nil
	if gz != nil {
		body = bytes.NewReader(gz)
		if dl != nil && dl.timer != nil {
			body = &progressBody{r: body, dl: dl}
		}
	} else if r.body != nil {
		body = r.body()
		if dl != nil && dl.timer != nil {
			body = &progressBody{r: body, dl: dl}
		}
	}
	req, err := http.NewRequestWithContext(ctx, r.method, r.url(d), body)
	if err != nil {
		return nil, 0, err
	}
	switch {
	case gz != nil:
		req.ContentLength = int64(len(gz))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(gz)), nil }
	case r.body != nil:
		req.ContentLength = r.bodyLen
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(r.body()), nil }
	}

	for k, vs := range d.headers {
		req.Header[k] = vs
	}
	if r.accept != "" {
		req.Header.Set("Accept", r.accept)
	}
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	if r.acceptEncoding != "" {
		req.Header.Set("Accept-Encoding", r.acceptEncoding)
	}
	if gz != nil {
		req.Header.Set("Content-Encoding", "gzip")
	}
	epoch := 0
	switch {
	case d.tokErr != nil:
		return nil, 0, d.tokErr
	case d.tok != nil:
		if epoch, err = d.tok.authorize(ctx, req); err != nil {
			if r.body != nil && req.Body != nil {
				_ = req.Body.Close()
			}
			return nil, 0, err
		}
	case d.sess != nil:
		if epoch, err = d.sess.authorize(ctx, d, req); err != nil {
			if r.body != nil && req.Body != nil {
				_ = req.Body.Close()
			}
			return nil, 0, err
		}
	case d.ep.Username != "" || d.ep.Password != "":
		req.SetBasicAuth(d.ep.Username, d.ep.Password)
	}
	resp, err := d.gatedDo(ctx, req)
	return resp, epoch, err
}

// drain reads a little of an unwanted body so the connection can be
// reused, then closes it.
func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
}

// readHTTPError consumes resp and turns it into an *HTTPError.
func readHTTPError(resp *http.Response, method, u string) *HTTPError {
	defer drain(resp)
	e := &HTTPError{Method: method, URL: u, Status: resp.StatusCode}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body struct {
		Error  any    `json:"error"`
		Reason string `json:"reason"`
	}
	if json.Unmarshal(b, &body) == nil {
		switch v := body.Error.(type) {
		case string:
			e.ErrorName = v
		case nil:
		default:
			e.ErrorName = fmt.Sprint(v)
		}
		e.Reason = body.Reason
	} else if s := strings.TrimSpace(string(b)); s != "" {
		if len(s) > 200 {
			s = s[:200] + "..."
		}
		e.Reason = s
	}
	return e
}

// getJSON sends r (retried per Options, request_timeout included) and
// decodes its whole JSON answer of at most limit bytes (what names it in
// errors); each attempt decodes into a fresh T.
func getJSON[T any](ctx context.Context, d *DB, r *request, limit int64, what string) (T, error) {
	var out T
	err := d.doRead(ctx, r, func(resp *http.Response) error {
		var v T
		if err := decodeLimited(resp, r, d, &v, limit, what); err != nil {
			return err
		}
		out = v
		return nil
	})
	return out, err
}

// decodeLimited decodes a whole JSON response of at most limit bytes
// (what names it in the error) into v and closes it.
func decodeLimited(resp *http.Response, r *request, d *DB, v any, limit int64, what string) error {
	defer drain(resp)
	body, err := wholeBody(resp, limit, what)
	if err != nil {
		return badResponse(r, d, err)
	}
	if err := json.NewDecoder(body).Decode(v); err != nil {
		return badResponse(r, d, err)
	}
	return nil
}

// badResponse is the error for an answer that could not be read: a
// malformed one (ErrBadResponse), one beyond a size limit
// (ErrResponseTooLarge) or a stalled or timed-out one (ErrStalled,
// ErrRequestTimeout, already naming the request).
func badResponse(r *request, d *DB, err error) error {
	switch {
	case errors.Is(err, ErrStalled), errors.Is(err, ErrRequestTimeout):
		return err
	case errors.Is(err, ErrResponseTooLarge):
		return fmt.Errorf("couch: %s %s: %w", r.method, r.redactedURL(d), err)
	case errors.Is(err, io.EOF):
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%w: %s %s: %w", ErrBadResponse, r.method, r.redactedURL(d), err)
}

// escapeDocID escapes a document ID for a URL path. Every byte outside
// RFC 3986's unreserved set is percent-encoded ("+" and "/" included, as
// CouchDB's replicator does), except the slash after "_design" and
// "_local", which CouchDB expects literally.
func escapeDocID(id string) string {
	for _, p := range [...]string{"_design/", "_local/"} {
		if strings.HasPrefix(id, p) {
			return p + escapeStrict(id[len(p):])
		}
	}
	return escapeStrict(id)
}

func escapeStrict(s string) string {
	const hex = "0123456789ABCDEF"
	n := 0
	for i := 0; i < len(s); i++ {
		if !unreserved(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if unreserved(c) {
			b = append(b, c)
		} else {
			b = append(b, '%', hex[c>>4], hex[c&15])
		}
	}
	return string(b)
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// encodeQuery is url.Values.Encode without sorting surprises: keys in the
// given order.
func encodeQuery(kv ...string) string {
	var sb strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		if sb.Len() > 0 {
			sb.WriteByte('&')
		}
		sb.WriteString(url.QueryEscape(kv[i]))
		sb.WriteByte('=')
		sb.WriteString(url.QueryEscape(kv[i+1]))
	}
	return sb.String()
}
