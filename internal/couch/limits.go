package couch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Default limits on what the client reads from a server (Limits' zero
// fields mean these). A well-behaved CouchDB stays far below them; a broken
// or hostile endpoint hits them and the request fails with an error naming
// the limit instead of growing the node's memory without bound.
const (
	// DefaultMaxDocumentBytes bounds one document (with its inline base64
	// attachments) in a _bulk_get or open_revs answer, and one design or
	// _local document: four times CouchDB's max_document_size of 8 MB.
	DefaultMaxDocumentBytes = 32 << 20
	// DefaultMaxLineBytes bounds one row of a _changes feed (a row lists
	// the document's leaf revisions: 8 MiB is some 200,000 of them).
	DefaultMaxLineBytes = 8 << 20
	// DefaultMaxBodyBytes bounds a response that is read whole (database
	// info, _revs_diff and _bulk_docs answers, open_revs answers with
	// their attachments).
	DefaultMaxBodyBytes = 64 << 20
)

// Limits bound what a DB reads from its server. The zero value means the
// defaults, and no read timeout.
type Limits struct {
	// ReadTimeout is the per-read idle deadline (CouchDB's
	// connection_timeout, ibrowse's inactivity timeout): the response
	// headers must arrive within it of sending the request, and every read
	// of the body must deliver a byte within it. A request that exceeds it
	// fails with an error matching ErrStalled (and is retried like a
	// connection error). Zero means no deadline.
	ReadTimeout time.Duration
	// MaxDocumentBytes bounds one document read from the server; zero
	// means DefaultMaxDocumentBytes.
	MaxDocumentBytes int64
	// MaxLineBytes bounds one row of a _changes feed; zero means
	// DefaultMaxLineBytes.
	MaxLineBytes int64
	// MaxBodyBytes bounds a response read whole; zero means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
}

// withDefaults fills the zero sizes.
func (l Limits) withDefaults() Limits {
	if l.MaxDocumentBytes <= 0 {
		l.MaxDocumentBytes = DefaultMaxDocumentBytes
	}
	if l.MaxLineBytes <= 0 {
		l.MaxLineBytes = DefaultMaxLineBytes
	}
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = DefaultMaxBodyBytes
	}
	return l
}

var (
	// ErrStalled: the server sent nothing (no response headers, or no
	// byte of the body) for longer than Limits.ReadTimeout.
	ErrStalled = errors.New("couch: endpoint stalled")
	// ErrRequestTimeout: a request (other than a _changes feed) got no
	// complete response, body included, within Options.RequestTimeout
	// (CouchDB's request_timeout; ibrowse's req_timedout).
	ErrRequestTimeout = errors.New("couch: request timed out")
	// ErrResponseTooLarge: a response, a document or a _changes row
	// exceeds one of Limits' sizes (or declares a Content-Length above it).
	ErrResponseTooLarge = errors.New("couch: response too large")
)

// TooLargeError is a response part beyond a limit. It matches
// ErrResponseTooLarge.
type TooLargeError struct {
	// What is what was too large: "document", "_changes row", "response body".
	What string
	// Limit is the limit in bytes.
	Limit int64
	// Declared is the Content-Length the server announced; 0 when the
	// limit was found while reading.
	Declared int64
}

func (e *TooLargeError) Error() string {
	if e.Declared > 0 {
		return fmt.Sprintf("%s of %d bytes (Content-Length) is more than the limit of %d bytes", e.What, e.Declared, e.Limit)
	}
	return fmt.Sprintf("%s is more than the limit of %d bytes", e.What, e.Limit)
}

// Is matches ErrResponseTooLarge.
func (e *TooLargeError) Is(target error) bool { return target == ErrResponseTooLarge }

// deadline bounds one request: a read deadline, armed when the request is
// sent and pushed back by every read that delivers bytes, and a whole
// request deadline (request_timeout) that nothing pushes back. When either
// fires it cancels the request's context with its cause (errStallCause,
// errRequestTimeoutCause).
type deadline struct {
	after time.Duration // read deadline; 0: none
	timer *time.Timer
	total time.Duration // request_timeout; 0: none
	whole *time.Timer
	// cancel ends the request's context.
	cancel context.CancelCauseFunc
	once   sync.Once
}

var (
	// errStallCause cancels a stalled request's context.
	errStallCause = errors.New("couch: read deadline reached")
	// errRequestTimeoutCause cancels the context of a request that took
	// longer than request_timeout.
	errRequestTimeoutCause = errors.New("couch: request_timeout reached")
)

// arm derives the request context and starts its deadlines: read (the
// per-read idle deadline) and total (the whole request, headers and body,
// until the body is closed). With neither it returns ctx and a nil
// deadline.
func arm(ctx context.Context, read, total time.Duration) (context.Context, *deadline) {
	if read <= 0 && total <= 0 {
		return ctx, nil
	}
	rctx, cancel := context.WithCancelCause(ctx)
	dl := &deadline{after: read, total: total, cancel: cancel}
	if read > 0 {
		dl.timer = time.AfterFunc(read, func() { cancel(errStallCause) })
	}
	if total > 0 {
		dl.whole = time.AfterFunc(total, func() { cancel(errRequestTimeoutCause) })
	}
	return rctx, dl
}

// stalled reports whether the read deadline fired.
func stalled(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), errStallCause)
}

// timedOut reports whether the whole-request deadline fired.
func timedOut(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), errRequestTimeoutCause)
}

// release stops the timers and frees the context.
func (dl *deadline) release() {
	if dl == nil {
		return
	}
	dl.once.Do(func() {
		if dl.timer != nil {
			dl.timer.Stop()
		}
		if dl.whole != nil {
			dl.whole.Stop()
		}
		dl.cancel(nil)
	})
}

// stallError describes a request the read deadline ended.
func stallError(method, url string, after time.Duration, phase string) error {
	return fmt.Errorf("%w: %s %s: nothing received for %s (%s; connection_timeout)", ErrStalled, method, url, after, phase)
}

// requestTimeoutError describes a request the whole-request deadline ended.
func requestTimeoutError(method, url string, after time.Duration, phase string) error {
	return fmt.Errorf("%w: %s %s: no complete response within %s (%s; request_timeout)", ErrRequestTimeout, method, url, after, phase)
}

// err is the error of a request one of dl's deadlines ended
// (ctx is the request's), or nil when neither fired.
func (dl *deadline) err(ctx context.Context, method, url, phase string) error {
	switch {
	case dl == nil:
		return nil
	case timedOut(ctx):
		return requestTimeoutError(method, url, dl.total, phase)
	case stalled(ctx):
		return stallError(method, url, dl.after, phase)
	}
	return nil
}

// guardedBody is a response body under a deadline (or none: dl nil):
// every read that delivers bytes pushes the read deadline back; a read a
// deadline ended returns an error matching ErrStalled or
// ErrRequestTimeout, another read error of the transport one matching
// errConnectionLost; Close releases the deadline.
type guardedBody struct {
	rc     io.ReadCloser
	ctx    context.Context
	dl     *deadline
	method string
	url    string
}

func (g *guardedBody) Read(p []byte) (int, error) {
	n, err := g.rc.Read(p)
	if n > 0 && g.dl != nil && g.dl.timer != nil {
		g.dl.timer.Reset(g.dl.after)
	}
	if err != nil && err != io.EOF {
		if derr := g.dl.err(g.ctx, g.method, g.url, "in the response body"); derr != nil {
			err = derr
		} else if g.ctx.Err() == nil {
			err = &lostError{err}
		}
	}
	return n, err
}

// errConnectionLost matches a response body that ended before its end
// because the connection did (cut, reset: the transport's read error,
// e.g. io.ErrUnexpectedEOF short of the Content-Length), not because of
// what the server sent; a request whose answer is read whole is sent again
// (retries_per_request), as couch_replicator_httpc retries ibrowse's
// closed connections.
var errConnectionLost = errors.New("couch: connection lost in the response body")

// lostError is a body read error of the transport: its text is the
// transport's, and it matches both that error and errConnectionLost.
type lostError struct{ err error }

func (e *lostError) Error() string   { return e.err.Error() }
func (e *lostError) Unwrap() []error { return []error{e.err, errConnectionLost} }

func (g *guardedBody) Close() error {
	err := g.rc.Close()
	g.dl.release()
	return err
}

// limitedBody reads at most limit bytes of a body that is read whole; one
// more gives a *TooLargeError.
type limitedBody struct {
	r     io.Reader
	left  int64
	limit int64
	what  string
}

func (l *limitedBody) Read(p []byte) (int, error) {
	if l.left <= 0 {
		// Probe for one more byte: a body of exactly limit bytes is fine.
		var one [1]byte
		n, err := l.r.Read(one[:])
		if n > 0 {
			return 0, &TooLargeError{What: l.what, Limit: l.limit}
		}
		return 0, err
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// wholeBody returns resp's body limited to limit bytes for a response read
// whole, or a *TooLargeError at once when the server declared more.
func wholeBody(resp *http.Response, limit int64, what string) (io.Reader, error) {
	if resp.ContentLength > limit {
		return nil, &TooLargeError{What: what, Limit: limit, Declared: resp.ContentLength}
	}
	return &limitedBody{r: resp.Body, left: limit, limit: limit, what: what}, nil
}

// progressBody is a request body under a deadline: every read that takes
// bytes from it (the transport sending them) pushes the read deadline
// back, so a large upload is not taken for a stalled server.
type progressBody struct {
	r  io.Reader
	dl *deadline
}

func (p *progressBody) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.dl.timer.Reset(p.dl.after)
	}
	return n, err
}
