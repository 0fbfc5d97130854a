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

// deadline is one request's read deadline: armed when the request is sent,
// pushed back by every read that delivers bytes, and when it fires it
// cancels the request's context with errStallCause.
type deadline struct {
	after  time.Duration
	timer  *time.Timer
	cancel context.CancelCauseFunc
	once   sync.Once
}

// errStallCause cancels a stalled request's context.
var errStallCause = errors.New("couch: read deadline reached")

// arm derives the request context and starts the deadline; with no
// ReadTimeout it returns ctx and a nil deadline.
func arm(ctx context.Context, after time.Duration) (context.Context, *deadline) {
	if after <= 0 {
		return ctx, nil
	}
	rctx, cancel := context.WithCancelCause(ctx)
	dl := &deadline{after: after, cancel: cancel}
	dl.timer = time.AfterFunc(after, func() { cancel(errStallCause) })
	return rctx, dl
}

// stalled reports whether the deadline fired.
func stalled(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), errStallCause)
}

// release stops the timer and frees the context.
func (dl *deadline) release() {
	if dl == nil {
		return
	}
	dl.once.Do(func() {
		dl.timer.Stop()
		dl.cancel(nil)
	})
}

// stallError describes a request the deadline ended.
func stallError(method, url string, after time.Duration, phase string) error {
	return fmt.Errorf("%w: %s %s: nothing received for %s (%s; connection_timeout)", ErrStalled, method, url, after, phase)
}

// guardedBody is a response body under a read deadline: every read that
// delivers bytes pushes the deadline back; a read the deadline ended
// returns an error matching ErrStalled; Close releases the deadline.
type guardedBody struct {
	rc     io.ReadCloser
	ctx    context.Context
	dl     *deadline
	method string
	url    string
}

func (g *guardedBody) Read(p []byte) (int, error) {
	n, err := g.rc.Read(p)
	if n > 0 {
		g.dl.timer.Reset(g.dl.after)
	}
	if err != nil && err != io.EOF && stalled(g.ctx) {
		err = stallError(g.method, g.url, g.dl.after, "in the response body")
	}
	return n, err
}

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
