package replicate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/pause"
)

// batchIdle flushes a partial batch when the feed has been quiet this long
// (continuous feeds, slow sources): between one and two batchIdle after its
// last row.
const batchIdle = 20 * time.Millisecond

// changesOptions sets o to the _changes request for the job's filters.
func (r *Replication) changesOptions(o *couch.ChangesOptions, since couch.Seq) {
	*o = couch.ChangesOptions{Feed: couch.FeedNormal, Since: since, Style: couch.StyleAllDocs}
	if r.p.WinningRevsOnly {
		o.Style = couch.StyleMainOnly
	}
	if r.p.Continuous {
		// One long-lived feed: the server sends a newline every heartbeat
		// while idle (which also overrides its timeout, so CouchDB never
		// ends the feed), and the client ends it when nothing at all
		// arrived for connection_timeout (the source DB's read deadline:
		// couch.ErrFeedStalled), then re-opens it from its last seq. No
		// timeout= is sent: an idle job costs no requests, only heartbeat
		// bytes.
		o.Feed = couch.FeedContinuous
		o.Heartbeat = feedHeartbeat(r.p.ConnectionTimeout)
	}
	switch {
	case r.p.DocIDs != nil:
		o.DocIDs = r.p.DocIDs
	case r.p.Selector != nil:
		o.Selector = r.p.Selector
	case r.p.Filter != "":
		o.Filter = r.p.Filter
		if r.p.QueryParams != nil {
			var m map[string]any
			_ = json.Unmarshal(r.p.QueryParams, &m)
			o.QueryParams = make(map[string]string, len(m))
			for k, v := range m {
				o.QueryParams[k] = queryValue(v)
			}
		}
	}
}

// feedHeartbeat is the heartbeat= of a continuous feed: a third of
// connection_timeout (CouchDB's replicator sends that as timeout=), at
// least a second unless connection_timeout is under 2 s, and always
// shorter than connection_timeout, the feed's stall window: a quiet but
// healthy feed sends a byte at least twice per window.
func feedHeartbeat(connectionTimeout time.Duration) time.Duration {
	return max(min(time.Second, connectionTimeout/2), connectionTimeout/3)
}

// Paging of a one-shot feed: the first request asks for one batch of rows,
// each next one for pageGrowth times more, up to pageMaxBatches batches.
const (
	pageGrowth     = 4
	pageMaxBatches = 32
)

// pager sizes the _changes requests of a one-shot replication. A server
// that builds the whole answer before sending its first byte (PouchDB
// Server does; so does any proxy that buffers) would otherwise keep the
// workers idle for as long as it takes to list every change: a short first
// page gets them going at once, and the pages then grow faster than the
// workers drain them. Pages also bound what such a server holds in memory
// for one answer. A continuous feed and a doc_ids feed (which may be
// filtered on the client, where limit= would count unfiltered rows) are
// read in one request, as before; so is the feed of a source whose seqs
// are opaque (Apache CouchDB 2 and later, Cloudant: clustered seqs), which
// streams a normal feed row by row as it reads its shards — one request,
// as CouchDB's own replicator reads it, with no round trip between pages
// (issue 25: 5,000 changes were three pages, two round trips more).
type pager struct {
	limit, max int // 0: no paging
}

func newPager(p Params, sourceSeq couch.Seq) pager {
	if p.Continuous || p.DocIDs != nil || streamsChanges(sourceSeq) {
		return pager{}
	}
	return pager{limit: p.WorkerBatchSize, max: p.WorkerBatchSize * pageMaxBatches}
}

// streamsChanges reports whether a source whose info gave updateSeq
// streams a normal _changes feed: its seqs are opaque (not numbers), as
// clustered CouchDB's are. Numeric seqs (PouchDB Server, CouchDB 1.x)
// are paged: PouchDB Server builds a page whole before its first byte.
func streamsChanges(updateSeq couch.Seq) bool {
	if updateSeq.IsZero() {
		return false
	}
	_, numeric := updateSeq.Int()
	return !numeric
}

// follows reports whether another page follows a page of got rows.
func (pg *pager) follows(got int) bool {
	return pg.limit != 0 && got >= pg.limit
}

// more reports whether another page follows a page of got rows, and sizes
// it.
func (pg *pager) more(got int) bool {
	if !pg.follows(got) {
		return false
	}
	pg.limit = min(pg.limit*pageGrowth, pg.max)
	return true
}

// readChanges is the changes reader plus the changes manager, run by the
// pipeline's goroutine: it reads the feed (a continuous feed is one
// request held open for as long as it works, re-opened from its last seq
// only after an error or when the server ends it) and hands every row to
// the batcher, which cuts batches of worker_batch_size rows in feed order. A feed's end is
// marked in the seq tracker after its rows, so through_seq reaches
// last_seq once every earlier batch is done. It returns nil when ctx is
// done or a one-shot feed has been read to its end. A continuous run that
// shares its source's feed (Options.Feeds) reads it through shared instead.
func (s *runState) readChanges(ctx context.Context, bt *batcher) error {
	cr := newChangesReader(s, bt)
	if s.r.sharesFeed() {
		return cr.shared(ctx)
	}
	s.startupDone() // a feed of its own: one request, its catch-up included
	for {
		if err := cr.request(ctx); err != nil || cr.done {
			return err
		}
	}
}

// changesReader is readChanges' state, on the heap: the goroutine reading
// a continuous feed spends its life in request, whose frame stays small.
type changesReader struct {
	s        *runState
	bt       *batcher
	opts     couch.ChangesOptions
	since    couch.Seq
	pages    pager
	failures int
	firstErr time.Time     // first failure of the current run of failures
	backoff  pause.Backoff // between re-opens of a feed: doubling, up to 5 minutes
	got      int           // rows of the current request
	began    time.Time     // when the current request was sent
	done     bool          // the reader has nothing more to do
	onRow    func(couch.Change) error
	// upTo is the source's update_seq at start-up while the rows up to
	// it are still to be read in windows (readWindows), else 0.
	upTo int64
}

//go:noinline
func newChangesReader(s *runState, bt *batcher) *changesReader {
	cr := &changesReader{s: s, bt: bt, since: s.startSeq, pages: newPager(s.r.p, s.sourceSeq)}
	cr.upTo = windowsUpTo(s)
	cr.backoff = pause.Backoff{Min: cr.firstWait(), Max: 5 * time.Minute}
	cr.onRow = func(c couch.Change) error {
		cr.got++
		return cr.bt.add(c)
	}
	return cr
}

// request reads the feed once, from since; it sets done when the reader
// should stop (ctx done, one-shot feed read to its end) and returns an
// error when the feed failed for good.
func (cr *changesReader) request(ctx context.Context) error {
	cr.got, cr.began = 0, time.Now()
	if cr.upTo != 0 {
		return cr.readWindows(ctx)
	}
	cr.s.r.changesOptions(&cr.opts, cr.since)
	cr.opts.Limit = cr.pages.limit
	continuous := cr.opts.Feed == couch.FeedContinuous
	if continuous {
		cr.s.park.feedLive(true)
	}
	end, err := cr.s.r.src.ReadChangesEnd(ctx, &cr.opts, cr.onRow)
	if continuous {
		cr.s.park.feedLive(false)
	}
	if ctx.Err() != nil {
		cr.done = true
		return nil
	}
	if end.LastSeq != nil {
		cr.since = end.LastSeq
	}
	if err != nil {
		return cr.failed(ctx, err)
	}
	cr.failures = 0
	cr.s.feedRead(end, !cr.s.r.p.Continuous && !cr.pages.follows(cr.got))
	if cr.pages.more(cr.got) {
		return nil
	}
	// A continuous feed's end moves through_seq to its last_seq; a one-shot
	// feed's does not: as in CouchDB (couch_replicator_changes_reader
	// queues last_seq only for continuous feeds), a one-shot run
	// checkpoints the seq of the last change it processed, and one that
	// processed none (nothing new, or doc_ids/a filter matching nothing)
	// writes no checkpoint and answers {"ok":true,"no_changes":true}.
	if err := cr.bt.end(cr.since, cr.s.r.p.Continuous); err != nil {
		cr.done = true
		return nil
	}
	cr.done = !cr.s.r.p.Continuous
	if !cr.done && cr.got == 0 && time.Since(cr.began) < cr.opts.Heartbeat {
		// The server ended a continuous feed at once without a row (a
		// proxy that cuts long requests, a server that does not hold
		// feeds): re-open it after a pause, not in a tight loop.
		return cr.pause(ctx)
	}
	cr.backoff.Reset()
	return nil
}

// windowsUpTo is the source's update_seq at start-up when a one-shot
// feed is to be read in windows first (readWindows), else 0: the job has
// no filter, the source's seqs are numbers, and its rows are dense enough
// — at least half as many documents (live or deleted: one row each) as
// seqs — for a window's page not to list many rows beyond it.
func windowsUpTo(s *runState) int64 {
	p := s.r.p
	if p.Continuous || p.DocIDs != nil || p.Selector != nil || p.Filter != "" || p.WorkerBatchSize < 1 {
		return 0
	}
	u, ok1 := s.sourceSeq.Int()
	from, ok2 := s.startSeq.Int()
	if !ok1 || !ok2 || s.sourceSeq.IsZero() || u <= from || 2*s.sourceRows < u {
		return 0
	}
	return u
}

// errWindowFailed ends a window whose previous window failed: it hands on
// none of its rows.
var errWindowFailed = errors.New("replicate: the _changes window before this one failed")

// changesWindow is one page of readWindows: the rows with seqs in
// (lo, hi], read with since=lo&limit=hi-lo.
type changesWindow struct {
	lo, hi int64
	prev   *changesWindow // the window before it, nil for the first
	done   chan struct{}
	end    couch.FeedEnd
	err    error
	last   couch.Seq // the seq of the last row handed on
}

// readWindows reads a one-shot feed of a source with numeric seqs up to
// its update_seq at start-up in windows of seqs — one batch, then a batch
// per worker each — each a normal _changes request with since= its start
// and limit= its width, so that it holds every row of its window (there
// are at most that many) and, without waiting for the page before it to
// end, the next window can be asked for: two are in flight, the second
// built by the server while the first is read. Windows stay that small:
// a single-threaded server (PouchDB Server) serves no _bulk_get while it
// builds a page, and under load a page of 8,000 rows took it 1.4 s, the
// workers idle. A page's rows beyond its window
// are dropped (the next window has them). Rows are handed on in feed
// order: a window's first row waits until the window before it is done.
// PouchDB Server builds a normal page whole before its first byte; page
// after page, each cost a round trip plus that wait while the workers
// idled. The rest of the feed (what changed since start-up) is then read
// as before, page after page to its end. On any failure the windows stop
// and the feed is re-opened from the last row handed on, with normal
// pages.
func (cr *changesReader) readWindows(ctx context.Context) error {
	u := cr.upTo
	cr.upTo = 0
	lo, _ := cr.since.Int()
	r := cr.s.r
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	width := int64(r.p.WorkerBatchSize)
	next := width * int64(max(r.p.WorkerProcesses, 1))
	var prev *changesWindow
	start := func() *changesWindow {
		w := &changesWindow{lo: lo, hi: min(lo+width, u), prev: prev, done: make(chan struct{})}
		lo, width, prev = w.hi, next, w
		var o couch.ChangesOptions
		r.changesOptions(&o, couch.SeqOf([]byte(strconv.FormatInt(w.lo, 10))))
		o.Limit = int(w.hi - w.lo)
		go func() {
			defer close(w.done)
			waited := false
			w.end, w.err = r.src.ReadChangesEnd(wctx, &o, func(c couch.Change) error {
				if !waited && w.prev != nil {
					select {
					case <-w.prev.done:
					case <-wctx.Done():
						return context.Cause(wctx)
					}
					if w.prev.err != nil {
						// Rows of the window before it are missing: none
						// of this one may be handed on (they would be cut
						// into batches ahead of the missing ones).
						return errWindowFailed
					}
					w.prev = nil // the windows do not chain in memory
				}
				waited = true
				if n, ok := c.Seq.Int(); !ok || c.Seq == nil || n > w.hi {
					return nil // the next window's
				}
				w.last = c.Seq
				return cr.onRow(c)
			})
		}()
		return w
	}
	inFlight := []*changesWindow{start()}
	for len(inFlight) > 0 {
		if lo < u && len(inFlight) < 2 {
			inFlight = append(inFlight, start())
			continue
		}
		w := inFlight[0]
		<-w.done
		inFlight = inFlight[1:]
		if w.last != nil {
			cr.since = w.last
		}
		if ctx.Err() != nil {
			cancel()
			cr.waitWindows(inFlight)
			cr.done = true
			return nil
		}
		if w.err != nil {
			cancel()
			cr.waitWindows(inFlight)
			return cr.failed(ctx, w.err)
		}
		// Every row up to hi has been handed on.
		cr.since = couch.SeqOf([]byte(strconv.FormatInt(w.hi, 10)))
		cr.failures = 0
	}
	// The last rows need not wait for the batcher's idle flush.
	if cr.bt.end(cr.since, false) != nil {
		cr.done = true
	}
	return nil
}

// waitWindows waits for windows being stopped.
func (cr *changesReader) waitWindows(ws []*changesWindow) {
	for _, w := range ws {
		<-w.done
	}
}

// firstWait is the first pause before re-opening a feed.
func (cr *changesReader) firstWait() time.Duration {
	if w := cr.s.r.o.RetryBackoff; w > 0 {
		return w
	}
	return couch.DefaultRetryBackoff
}

// pause waits the next backoff or until ctx is done.
func (cr *changesReader) pause(ctx context.Context) error {
	if pause.For(ctx, cr.backoff.Next()) != nil {
		cr.done = true
	}
	return nil
}

// failed handles a request that failed: after a pause it is retried from
// since, unless the error is final or the retries are used up.
func (cr *changesReader) failed(ctx context.Context, err error) error {
	r := cr.s.r
	r.event(EventChangesReadFailed)
	var herr *couch.HTTPError
	if errors.As(err, &herr) && !herr.Retryable() || errors.Is(err, couch.ErrCertificate) || errors.Is(err, couch.ErrSession) {
		return fmt.Errorf("%w: %w", ErrChangesFailed, err)
	}
	if cr.got > 0 || (cr.opts.Heartbeat > 0 && time.Since(cr.began) > 2*r.p.ConnectionTimeout) {
		// The feed worked for a while before it broke (rows, or
		// heartbeats kept it open for twice the client's stall window,
		// connection_timeout): a fresh failure.
		cr.failures = 0
		cr.backoff.Reset()
	}
	if cr.failures == 0 {
		cr.firstErr = time.Now()
	}
	cr.failures++
	if cr.failures > r.p.RetriesPerRequest {
		return fmt.Errorf("%w: after %d attempts: %w", ErrChangesFailed, cr.failures, err)
	}
	if b := r.o.Endpoints.errorBudget(); b > 0 && time.Since(cr.firstErr) >= b {
		return fmt.Errorf("%w: still failing after %s (the error budget, health_threshold/2): %w", ErrChangesFailed, b.Round(time.Millisecond), err)
	}
	r.log.Warn().Err(err).Int("attempt", cr.failures).Str("since", seqOrZero(cr.since).String()).
		Msg("replication: changes feed failed, resuming")
	return cr.pause(ctx)
}

// batcher cuts the feed's rows into batches of worker_batch_size and
// submits them to the workers. The changes reader appends rows; a partial
// batch is cut at once after a row of a continuous feed at rest (nothing
// more received: couch.Change.Rest), as CouchDB's workers take what the
// changes queue holds; otherwise it is flushed once the feed has been
// quiet for batchIdle (checked by a
// timer, not a goroutine: an idle feed holds neither a goroutine nor a
// batch buffer here). Batches are registered with the seq tracker in feed
// order when they are cut, so the order they reach the workers in does not
// matter.
type batcher struct {
	s      *runState
	size   int
	submit func(batch) error

	mu     sync.Mutex
	cur    []couch.Change // allocated by a batch's first row
	rows   uint64         // rows appended so far
	seen   uint64         // rows when the idle timer was armed or last checked
	timer  *time.Timer    // the idle flush (made by the first row); armed while cur is not empty
	armed  bool
	closed bool
	// dropped: close found rows not yet cut into a batch (they are
	// read again by the next run, from its checkpoint).
	dropped bool
	// waiting is len(cur), for empty (the run's timers must not take mu:
	// cut holds it while it pokes them).
	waiting atomic.Int32
	// flushing counts idle flushes submitting a batch outside mu.
	flushing sync.WaitGroup
}

func newBatcher(s *runState, submit func(batch) error) *batcher {
	return &batcher{s: s, size: s.r.p.WorkerBatchSize, submit: submit}
}

// add appends one row, submitting the batch when it is full.
func (b *batcher) add(c couch.Change) error {
	b.mu.Lock()
	if c.Seq == nil && len(b.cur) > 0 {
		c.Seq = b.cur[len(b.cur)-1].Seq
	}
	if b.cur == nil {
		b.cur = make([]couch.Change, 0, b.size)
	}
	b.cur = append(b.cur, c)
	b.waiting.Store(int32(len(b.cur)))
	b.rows++
	if len(b.cur) < b.size && !c.Rest {
		if !b.armed {
			b.armed, b.seen = true, b.rows
			if b.timer == nil {
				b.timer = time.AfterFunc(batchIdle, b.idle)
			} else {
				b.timer.Reset(batchIdle)
			}
		}
		b.mu.Unlock()
		return nil
	}
	out := b.cut()
	b.mu.Unlock()
	return b.submit(out)
}

// end submits the partial batch and, when mark is set, marks the end of a
// feed at seq: a change-less mark needs no worker, it is done as soon as it
// is registered.
func (b *batcher) end(seq couch.Seq, mark bool) error {
	b.mu.Lock()
	var out batch
	if len(b.cur) > 0 {
		out = b.cut()
	}
	if mark {
		s := b.s
		s.mu.Lock()
		s.tracker.finish(s.tracker.start(seq))
		s.mu.Unlock()
	}
	b.mu.Unlock()
	if out.changes == nil {
		return nil
	}
	return b.submit(out)
}

// cut takes the current batch and registers it with the seq tracker, and
// brings the run's next progress check to within ProgressInterval; b.mu
// is held.
func (b *batcher) cut() batch {
	changes := b.cur
	b.cur = nil
	b.waiting.Store(0)
	if b.armed {
		b.timer.Stop()
		b.armed = false
	}
	seq := changes[len(changes)-1].Seq
	s := b.s
	s.mu.Lock()
	n := s.tracker.start(seq)
	if seq != nil {
		s.cutSeq, s.readSeq = seq, laterSeq(s.readSeq, seq)
	}
	s.mu.Unlock()
	s.park.touch()
	s.pokeProgress()
	return batch{n: n, changes: changes, seq: seq}
}

// idle is the idle timer's function: it flushes the partial batch when no
// row arrived since the timer was armed or last checked, else checks again
// batchIdle later.
func (b *batcher) idle() {
	b.mu.Lock()
	if b.closed || len(b.cur) == 0 {
		b.mu.Unlock()
		return
	}
	if b.rows != b.seen {
		b.seen = b.rows
		b.timer.Reset(batchIdle)
		b.mu.Unlock()
		return
	}
	out := b.cut()
	b.flushing.Add(1)
	b.mu.Unlock()
	defer b.flushing.Done()
	_ = b.submit(out) // fails only when the run is stopping
}

// empty reports whether no row waits to be cut into a batch.
func (b *batcher) empty() bool { return b.waiting.Load() == 0 }

// close stops the idle timer and waits for a flush under way; nothing is
// submitted afterwards.
func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	b.dropped = len(b.cur) > 0
	if b.timer != nil {
		b.timer.Stop()
	}
	b.mu.Unlock()
	b.flushing.Wait()
}
