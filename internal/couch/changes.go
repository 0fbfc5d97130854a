package couch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"time"
)

// Feed types for ChangesOptions.Feed.
const (
	FeedNormal     = "normal"
	FeedLongpoll   = "longpoll"
	FeedContinuous = "continuous"
)

// Styles for ChangesOptions.Style.
const (
	// StyleAllDocs lists every leaf revision (what replication needs).
	StyleAllDocs = "all_docs"
	// StyleMainOnly lists only the winning revision (winning_revs_only).
	StyleMainOnly = "main_only"
)

// ChangesOptions select and shape a _changes request. At most one of
// DocIDs, Selector and Filter may be set.
type ChangesOptions struct {
	// Feed is FeedNormal (default), FeedLongpoll or FeedContinuous.
	Feed string
	// Since is where to start; the zero Seq means the beginning.
	Since Seq
	// Style is StyleAllDocs or StyleMainOnly; empty sends none (the
	// server's default, main_only).
	Style string
	// Limit caps the number of rows; 0 means no limit.
	Limit int
	// SeqInterval asks CouchDB to compute seqs only every N rows (others
	// come back null); 0 sends none.
	SeqInterval int
	// Heartbeat asks the server for a newline every Heartbeat while idle.
	// A feed that then sends nothing at all (heartbeats dropped by a
	// proxy that keeps the connection open) ends with an error matching
	// ErrFeedStalled after the DB's Limits.ReadTimeout (connection_timeout,
	// which must be longer than Heartbeat) without a byte; a DB without a
	// ReadTimeout ends it after 2×Heartbeat+5 s.
	Heartbeat time.Duration
	// Timeout is sent as timeout=; the server should end a longpoll or
	// continuous feed after so long without changes. Client-side, if the
	// server does not (PouchDB Server never does), the feed is ended
	// cleanly after Timeout+max(1 s, Timeout/4) without a change row,
	// returning the last seq seen.
	Timeout time.Duration
	// DocIDs filters by document ID (POST filter=_doc_ids; on 405 the feed
	// is read unfiltered and filtered here, as CouchDB's replicator does).
	DocIDs []string
	// Selector filters by a Mango selector (POST filter=_selector).
	Selector json.RawMessage
	// Filter is a named filter, "ddoc/name" or a built-in "_view"/"_design".
	Filter string
	// QueryParams are passed to the filter as query-string parameters.
	QueryParams map[string]string
	// IncludeDocs asks for each row's document (include_docs=true), given
	// in Change.Doc.
	IncludeDocs bool
}

// Change is one row of a changes feed.
type Change struct {
	// Seq is the row's sequence; nil when the server skipped it (seq_interval).
	Seq Seq
	ID  string
	// Revs are the leaf revisions the row lists (all leaves with
	// style=all_docs), in the server's order: do not assume the winner is
	// first (PouchDB Server does not put it there).
	Revs    []string
	Deleted bool
	// Doc is the row's document with ChangesOptions.IncludeDocs (nil
	// when the server sent none or null).
	Doc json.RawMessage
	// Rest marks a row of a continuous feed after which nothing more had
	// arrived: the feed is at rest (a batcher may cut its batch at once
	// instead of waiting to see whether more rows come).
	Rest bool
}

// errFeedTimedOut cancels a feed whose server ignored timeout=.
var errFeedTimedOut = errors.New("couch: changes feed timeout reached")

// Changes reads the changes feed, calling fn for every row in order, and
// returns the feed's last_seq. The response is decoded as a stream: memory
// does not grow with the feed. Blank lines (heartbeats) are ignored
// wherever they appear. A continuous feed returns when the server ends it
// (after Timeout), when ctx is done, or when fn returns an error (which is
// returned as is).
//
// On any error lastSeq is the seq of the last row delivered to fn (or
// opts.Since), so a caller can resume from it. Errors before the response
// arrives are retried per Options; errors mid-stream are not (the caller
// resumes from lastSeq).
//
// While it waits for the server, Changes keeps its state on the heap and
// its stack shallow (a few hundred bytes above net/http's): a goroutine
// that spends its life in a continuous feed keeps a small stack.
func (d *DB) Changes(ctx context.Context, opts ChangesOptions, fn func(Change) error) (lastSeq Seq, err error) {
	return d.ReadChanges(ctx, &opts, fn)
}

// ReadChanges is Changes with the options passed by pointer (not retained,
// not modified): a caller reading a feed in a loop on a long-lived
// goroutine keeps its frame small with it.
func (d *DB) ReadChanges(ctx context.Context, opts *ChangesOptions, fn func(Change) error) (lastSeq Seq, err error) {
	end, err := d.ReadChangesEnd(ctx, opts, fn)
	return end.LastSeq, err
}

// FeedEnd is how a _changes answer ended.
type FeedEnd struct {
	// LastSeq is the feed's last_seq (on an error: the seq of the last row
	// delivered, or the request's since).
	LastSeq Seq
	// Pending is the answer's "pending": how many changes the source has
	// after LastSeq. CouchDB gives it in normal and longpoll answers and in
	// the last line of a continuous feed that ends; PouchDB Server 4.2
	// never does. Nil when the answer had none, or when doc_ids were
	// filtered here (the server's count is of unfiltered rows).
	Pending *int64
}

// ReadChangesEnd is ReadChanges, also returning the answer's "pending".
func (d *DB) ReadChangesEnd(ctx context.Context, opts *ChangesOptions, fn func(Change) error) (FeedEnd, error) {
	f := newFeed()
	f.d, f.opts, f.fn, f.lastSeq = d, opts, fn, opts.Since
	if err := f.open(ctx); err != nil {
		return FeedEnd{LastSeq: f.lastSeq}, err
	}
	err := f.read()
	f.close(err)
	end := FeedEnd{LastSeq: f.lastSeq}
	if err == nil && f.clientIDs == nil {
		end.Pending = f.pending
	}
	return end, err
}

// PendingSince asks the source how many changes it has after since
// (GET _changes?since=...&limit=0, its "pending"), as CouchDB's replicator
// does for sources whose seqs are not numbers
// (couch_replicator_api_wrap:get_pending_count/2). It returns nil, and no
// error, when the answer has no "pending" (PouchDB Server).
func (d *DB) PendingSince(ctx context.Context, since Seq) (*int64, error) {
	q := url.Values{"limit": {"0"}}
	if !since.IsZero() {
		q.Set("since", since.Param())
	}
	out, err := getJSON[struct {
		Pending *int64 `json:"pending"`
	}](ctx, d, &request{method: http.MethodGet, path: "_changes", query: q.Encode()}, d.lim.MaxBodyBytes, "response body")
	if err != nil {
		return nil, err
	}
	return out.Pending, nil
}

// newFeed allocates a feed on the heap: left to escape analysis it would
// live in ReadChanges' frame, on the stack of a goroutine that may wait on
// the feed for its whole life.
//
//go:noinline
func newFeed() *feed { return new(feed) }

// feed is one _changes response being read.
type feed struct {
	d         *DB
	opts      *ChangesOptions // the caller's, for the call's duration
	fn        func(Change) error
	lastSeq   Seq
	pending   *int64 // the answer's "pending", if it had one
	r         *request
	clientIDs map[string]struct{} // doc_ids filtered here (the server answered 405)
	ctx       context.Context
	cancel    context.CancelCauseFunc
	resp      *http.Response
	w         *feedWatch
	js        *jsonStream
	row       changeRow
}

// open sends the request (retried per Options) and prepares the stream.
func (f *feed) open(ctx context.Context) error {
	d, opts := f.d, f.opts
	r, clientIDs, err := changesRequest(*opts)
	if err != nil {
		return err
	}
	f.ctx, f.cancel = context.WithCancelCause(ctx)
	resp, err := d.do(f.ctx, r)
	if err != nil && clientIDs == nil && opts.DocIDs != nil && isStatus(err, http.StatusMethodNotAllowed) {
		// The server cannot filter by POSTed doc_ids: read everything and filter here.
		o := *opts
		o.DocIDs = nil
		if r, _, err = changesRequest(o); err != nil {
			f.cancel(nil)
			return err
		}
		clientIDs = make(map[string]struct{}, len(opts.DocIDs))
		for _, id := range opts.DocIDs {
			clientIDs[id] = struct{}{}
		}
		resp, err = d.do(f.ctx, r)
	}
	if err != nil {
		f.cancel(nil)
		if errors.Is(err, ErrStalled) {
			// Not even the headers within connection_timeout.
			err = fmt.Errorf("%w: %w", ErrFeedStalled, err)
		}
		return err
	}
	f.r, f.clientIDs, f.resp = r, clientIDs, resp
	f.w = newFeedWatch(f.cancel, *opts, d.lim.ReadTimeout)
	body := io.Reader(resp.Body)
	if f.w.stall != nil {
		body = &activityReader{r: resp.Body, w: f.w}
	}
	f.js = newLimitedJSONStream(body, d.lim.MaxLineBytes, "_changes row")
	return nil
}

// close ends the response: after an error the feed may never end
// (continuous, or a server ignoring timeout=), so the connection is
// dropped instead of read on.
func (f *feed) close(err error) {
	f.w.stop()
	if err != nil {
		f.cancel(err)
		_ = f.resp.Body.Close()
	} else {
		drain(f.resp)
	}
	f.cancel(nil)
}

func (f *feed) read() error {
	if f.opts.Feed == FeedContinuous {
		return f.continuous()
	}
	return f.normal()
}

// continuous reads a continuous feed: one row object per line.
func (f *feed) continuous() error {
	row := &f.row
	for {
		if err := f.readRow(); err != nil {
			return f.fail(err)
		}
		if row.Error != nil {
			return feedRowError(f.r, f.d, row)
		}
		if row.LastSeq != nil {
			f.lastSeq, f.pending = row.LastSeq, row.Pending
			return nil
		}
		if err := f.deliver(); err != nil {
			return err
		}
	}
}

// normal reads a normal or longpoll feed:
// {"results":[...],"last_seq":...,"pending":...}.
func (f *feed) normal() error {
	js := f.js
	if err := js.delim('{'); err != nil {
		return f.fail(err)
	}
	var final Seq
	for first := true; ; first = false {
		key, ok, err := js.key(first)
		if err != nil {
			return f.fail(err)
		}
		if !ok {
			break
		}
		switch key {
		case "results":
			if err := f.results(); err != nil {
				return err
			}
		case "last_seq":
			raw, err := js.value()
			if err != nil {
				return f.fail(err)
			}
			final = SeqOf(raw)
		case "pending":
			raw, err := js.value()
			if err != nil {
				return f.fail(err)
			}
			f.pending = parsePending(raw)
		case "error":
			e, _ := js.value()
			return badResponse(f.r, f.d, fmt.Errorf("feed reported error %s", e))
		default:
			if _, err := js.value(); err != nil {
				return f.fail(err)
			}
		}
	}
	if final != nil {
		f.lastSeq = final
	}
	return nil
}

// results reads the rows of a normal feed's "results" array.
func (f *feed) results() error {
	js := f.js
	if err := js.delim('['); err != nil {
		return f.fail(err)
	}
	for first := true; ; first = false {
		more, err := js.more(first)
		if err != nil {
			return f.fail(err)
		}
		if !more {
			return nil
		}
		if err := f.readRow(); err != nil {
			return f.fail(err)
		}
		if err := f.deliver(); err != nil {
			return err
		}
	}
}

// readRow reads the next row object into f.row.
func (f *feed) readRow() error {
	raw, err := f.js.value()
	if err != nil {
		return err
	}
	return parseChangeRow(raw, &f.row)
}

// deliver hands f.row to fn (unless filtered out here).
func (f *feed) deliver() error {
	row := &f.row
	f.w.rowSeen()
	if row.Seq != nil {
		f.lastSeq = row.Seq
	}
	if f.clientIDs != nil {
		if _, ok := f.clientIDs[row.ID]; !ok {
			return nil
		}
	}
	rest := f.opts.Feed == FeedContinuous && f.js.atRest()
	return f.fn(Change{Seq: row.Seq, ID: row.ID, Deleted: row.Deleted, Revs: row.Revs, Doc: row.Doc, Rest: rest})
}

// fail turns a read error into the feed's error: nil when the feed watch
// ended a feed whose server ignored timeout=.
func (f *feed) fail(err error) error {
	if cause := context.Cause(f.ctx); cause != nil && f.ctx.Err() != nil {
		switch {
		case errors.Is(cause, errFeedTimedOut):
			return nil
		case errors.Is(cause, ErrFeedStalled):
			return fmt.Errorf("%w: %s %s: nothing received for %s", ErrFeedStalled, f.r.method, f.r.redactedURL(f.d), f.w.stallAfter)
		}
		return fmt.Errorf("couch: %s %s: %w", f.r.method, f.r.redactedURL(f.d), cause)
	}
	if errors.Is(err, ErrStalled) {
		// The read deadline (connection_timeout) ended a feed that sent
		// nothing, not even a heartbeat.
		return fmt.Errorf("%w: %w", ErrFeedStalled, err)
	}
	return badResponse(f.r, f.d, err)
}

type changeRow struct {
	Seq     Seq
	ID      string
	Revs    []string
	Deleted bool
	Doc     json.RawMessage
	LastSeq Seq
	Pending *int64 // with LastSeq: the feed's "pending"
	Error   json.RawMessage
	Reason  string
}

// parsePending reads a "pending" value: a non-negative integer, else nil.
func parsePending(raw []byte) *int64 {
	n, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
	if err != nil || n < 0 {
		return nil
	}
	return &n
}

// parseChangeRow reads one checked row object of a changes feed into
// row: {"seq","id","changes":[{"rev"}],"deleted","doc"}, or the
// continuous feed's {"last_seq"} or {"error","reason"}. Seqs and the
// document are copied; nothing else points into raw.
func parseChangeRow(raw []byte, row *changeRow) error {
	*row = changeRow{}
	if len(raw) == 0 || raw[0] != '{' {
		return fmt.Errorf("changes row is not an object: %.100s", raw)
	}
	err := objectMembers(raw, func(key, val []byte) error {
		var err error
		switch string(key) {
		case `"seq"`:
			row.Seq = SeqOf(val)
		case `"id"`:
			row.ID, err = unquote(val)
		case `"changes"`:
			if val[0] != '[' {
				return fmt.Errorf("changes row: \"changes\" is not an array: %.100s", val)
			}
			err = arrayElements(val, func(c []byte) error {
				if c[0] != '{' {
					return fmt.Errorf("changes row: change is not an object: %.100s", c)
				}
				rev := ""
				err := objectMembers(c, func(key, val []byte) error {
					if string(key) != `"rev"` {
						return nil
					}
					var err error
					rev, err = unquote(val)
					return err
				})
				row.Revs = append(row.Revs, rev)
				return err
			})
		case `"deleted"`:
			row.Deleted = string(val) == "true"
		case `"doc"`:
			if val[0] == '{' {
				row.Doc = json.RawMessage(bytes.Clone(val))
			}
		case `"last_seq"`:
			row.LastSeq = SeqOf(val)
		case `"pending"`:
			row.Pending = parsePending(val)
		case `"error"`:
			if string(val) != "null" {
				row.Error = json.RawMessage(bytes.Clone(val))
			}
		case `"reason"`:
			if val[0] == '"' {
				row.Reason, err = unquote(val)
			}
		}
		return err
	})
	return err
}

func feedRowError(r *request, d *DB, row *changeRow) error {
	return fmt.Errorf("couch: %s %s: feed reported error %s: %s", r.method, r.redactedURL(d), row.Error, row.Reason)
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("expected %q, got %v", want, tok)
	}
	return nil
}

func isStatus(err error, code int) bool {
	var he *HTTPError
	return errors.As(err, &he) && he.Status == code
}

// changesRequest builds the request; it never needs client-side filtering
// itself (the 405 fallback does).
func changesRequest(o ChangesOptions) (*request, map[string]struct{}, error) {
	n := 0
	if o.DocIDs != nil {
		n++
	}
	if o.Selector != nil {
		n++
	}
	if o.Filter != "" {
		n++
	}
	if n > 1 {
		return nil, nil, fmt.Errorf("couch: changes: doc_ids, selector and filter are mutually exclusive")
	}
	q := make([]string, 0, 16)
	switch o.Feed {
	case "", FeedNormal:
	case FeedLongpoll, FeedContinuous:
		q = append(q, "feed", o.Feed)
	default:
		return nil, nil, fmt.Errorf("couch: changes: unknown feed %q", o.Feed)
	}
	if o.Style != "" {
		q = append(q, "style", o.Style)
	}
	if !o.Since.IsZero() {
		q = append(q, "since", o.Since.Param())
	}
	if o.Limit > 0 {
		q = append(q, "limit", strconv.Itoa(o.Limit))
	}
	if o.SeqInterval > 0 {
		q = append(q, "seq_interval", strconv.Itoa(o.SeqInterval))
	}
	if o.Heartbeat > 0 {
		q = append(q, "heartbeat", strconv.FormatInt(max(o.Heartbeat.Milliseconds(), 1), 10))
	}
	if o.Timeout > 0 {
		q = append(q, "timeout", strconv.FormatInt(max(o.Timeout.Milliseconds(), 1), 10))
	}
	if o.IncludeDocs {
		q = append(q, "include_docs", "true")
	}
	r := &request{method: http.MethodGet, path: "_changes", feed: true}
	switch {
	case o.DocIDs != nil:
		q = append(q, "filter", "_doc_ids")
		body, l, err := jsonBody(struct {
			DocIDs []string `json:"doc_ids"`
		}{o.DocIDs})
		if err != nil {
			return nil, nil, err
		}
		r.method, r.body, r.bodyLen, r.contentType = http.MethodPost, body, l, "application/json"
	case o.Selector != nil:
		q = append(q, "filter", "_selector")
		body, l, err := jsonBody(struct {
			Selector json.RawMessage `json:"selector"`
		}{o.Selector})
		if err != nil {
			return nil, nil, err
		}
		r.method, r.body, r.bodyLen, r.contentType = http.MethodPost, body, l, "application/json"
	case o.Filter != "":
		q = append(q, "filter", o.Filter)
	}
	keys := make([]string, 0, len(o.QueryParams))
	for k := range o.QueryParams {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q = append(q, k, o.QueryParams[k])
	}
	r.query = encodeQuery(q...)
	return r, nil, nil
}

// Grace periods of feedWatch; variables so tests can shorten them.
var (
	idleGrace  = time.Second
	stallGrace = 5 * time.Second
)

// feedWatch ends a feed the server keeps open: after Timeout+grace without
// a row (cleanly), or, on a DB without a read deadline, after
// 2×Heartbeat+5 s without a byte (ErrFeedStalled). With a read deadline
// (connection_timeout) the response body's own deadline ends a feed that
// sends nothing, after connection_timeout: one stall window, the job's.
type feedWatch struct {
	idle       *time.Timer
	idleAfter  time.Duration
	stall      *time.Timer
	stallAfter time.Duration
}

func newFeedWatch(cancel context.CancelCauseFunc, o ChangesOptions, readTimeout time.Duration) *feedWatch {
	w := &feedWatch{}
	if o.Timeout > 0 && (o.Feed == FeedLongpoll || o.Feed == FeedContinuous) {
		w.idleAfter = o.Timeout + max(idleGrace, o.Timeout/4)
		w.idle = time.AfterFunc(w.idleAfter, func() { cancel(errFeedTimedOut) })
	}
	if o.Heartbeat > 0 && readTimeout <= 0 {
		w.stallAfter = 2*o.Heartbeat + stallGrace
		w.stall = time.AfterFunc(w.stallAfter, func() { cancel(ErrFeedStalled) })
	}
	return w
}

func (w *feedWatch) rowSeen() {
	if w.idle != nil {
		w.idle.Reset(w.idleAfter)
	}
}

func (w *feedWatch) bytesSeen() {
	w.stall.Reset(w.stallAfter)
}

func (w *feedWatch) stop() {
	if w.idle != nil {
		w.idle.Stop()
	}
	if w.stall != nil {
		w.stall.Stop()
	}
}

// activityReader tells the feed watch about every byte received.
type activityReader struct {
	r io.Reader
	w *feedWatch
}

func (a *activityReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if n > 0 {
		a.w.bytesSeen()
	}
	return n, err
}
