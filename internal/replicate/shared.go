package replicate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/mango"
	"github.com/couchrep/couchrep/internal/sharedfeed"
)

// sharesFeed reports whether the run reads the node's shared feed of its
// source (Options.Feeds) instead of a continuous feed of its own. Only
// continuous replications whose filter the node applies as the server
// would share: doc_ids (filter=_doc_ids lists the rows of those ids, which
// is the unfiltered feed's rows of those ids), no filter at all, and a
// Mango selector the node evaluates (internal/mango) on the documents of a
// feed read with include_docs=true, shared by the source's selector jobs
// whatever their selectors (see sharedfeed.Filter for what is matched: the
// winning revision). A named filter (server-side JavaScript with the job's
// query_params) and a selector the node leaves to the server
// (mango.ErrUnsupported) read their own feed.
//
// One-shot selector jobs keep the server's filter=_selector: against
// CouchDB it sends only the matching rows, where a node-side filter would
// read every document of the source once per job.
func (r *Replication) sharesFeed() bool {
	if r.o.Feeds == nil || !r.p.Continuous {
		return false
	}
	_, err := r.feedFilter()
	if err != nil {
		r.log.Info().Err(err).Msg("replication: the selector is evaluated by the source (a feed of its own), not on the node")
	}
	return err == nil
}

// ParksOnSharedFeed reports whether an idle run of p parks on a watch on
// its shared feed (WatchFeed) rather than on its server's _db_updates: a
// continuous filtered replication (doc_ids, or a selector: a write to its
// database may not concern it), with checkpoints and idle_park_after set.
// A selector the node does not evaluate makes WatchFeed fail with
// ErrNoSharedFeed: such a job keeps its feed.
func ParksOnSharedFeed(p Params) bool {
	return p.Continuous && p.UseCheckpoints && p.IdleParkAfter > 0 && p.Filter == "" &&
		(p.DocIDs != nil || p.Selector != nil)
}

// ErrNoSharedFeed is WatchFeed's error for a replication that does not
// share its source's feed.
var ErrNoSharedFeed = errors.New("replication: does not share its source's feed")

// WatchFeed opens the wake-up of a parked run of p on the node's shared
// feed of its source (o.Feeds): a watch with the run's filter (its
// doc_ids, its selector evaluated on the node, or none), whose C fires
// when the feed reads a row a run would replicate. A parked job's whole
// footprint on the feed is the watch; thousands of fan-out jobs of one
// source hold one feed and no engine. The watch outlives the feed's
// failures (it moves to the next feed). ErrNoSharedFeed when a run of p
// would read a feed of its own (one-shot, a named filter, a selector the
// node leaves to the source, no hub).
func WatchFeed(ctx context.Context, p Params, o Options) (*FeedWake, error) {
	r := &Replication{p: p, o: o, log: o.Logger}
	if !r.sharesFeed() {
		return nil, ErrNoSharedFeed
	}
	filter, err := r.feedFilter()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoSharedFeed, err)
	}
	w, err := o.Feeds.Watch(ctx, r.feedSource(), filter)
	if err != nil {
		return nil, err
	}
	return &FeedWake{w: w}, nil
}

// FeedWake is a parked job's wake-up on its shared feed (WatchFeed): C and
// Close as park.Wake's, and Moved, which answers from the watch what
// Parked.Moved asks the source (no request): a filtered job wakes for its
// own rows, not for every write to a central database.
type FeedWake struct {
	w *sharedfeed.Watch
}

// C fires when the feed read a row for the job (or failed, or started
// again after a failure).
func (fw *FeedWake) C() <-chan struct{} { return fw.w.C() }

// Close ends the watch.
func (fw *FeedWake) Close() { fw.w.Close() }

// OnSignal makes the watch call f at every signal (park.Notifier): a parked
// job waits on it without a goroutine.
func (fw *FeedWake) OnSignal(f func()) { fw.w.OnSignal(f) }

// Moved reports whether a job parked at seq (its checkpoint) has a row to
// replicate: the watch took a row after seq, or its feed failed and rows up
// to the next feed's start, after seq, may have been missed. The watch is
// open from before the job's run reached seq (it is held from the job's
// start), so a row after seq it did not take is one the job's filter drops.
func (fw *FeedWake) Moved(seq couch.Seq) bool {
	last, until, lost := fw.w.Marks()
	return lost || last != nil && SeqPast(last, seq) || until != nil && SeqPast(until, seq)
}

// feedFilter is the filter of the run's subscription to its shared feed;
// an error when the run cannot share.
func (r *Replication) feedFilter() (sharedfeed.Filter, error) {
	switch {
	case r.p.Filter != "":
		return sharedfeed.Filter{}, errors.New("a named filter runs on the source")
	case r.p.Selector != nil:
		sel, err := mango.Parse(r.p.Selector)
		if err != nil {
			return sharedfeed.Filter{}, err
		}
		return sharedfeed.Filter{Selector: sel}, nil
	}
	return sharedfeed.Filter{DocIDs: r.p.DocIDs}, nil
}

// feedSource is the shared feed this run subscribes to. Its key is a digest
// of everything that shapes the request and its connection: the source's
// URL with its credentials, headers and Basic auth, proxy, socket options,
// connection_timeout (the heartbeat), retries_per_request, the style and
// include_docs (selector jobs share a feed with documents, the others one
// without). Jobs with other credentials never share a feed.
func (r *Replication) feedSource() sharedfeed.Source {
	p, o := r.p, r.o
	var opts couch.ChangesOptions
	r.changesOptions(&opts, nil)
	docs := p.Selector != nil
	key, _ := json.Marshal(struct {
		Source            EndpointParams
		Socket            string
		ConnectionTimeout time.Duration
		Retries           int
		Style             string
		IncludeDocs       bool
	}{p.Source, p.SocketOptions, p.ConnectionTimeout, p.RetriesPerRequest, opts.Style, docs})
	sum := sha256.Sum256(key)
	name := "" // for logs, credentials redacted
	if r.src != nil {
		name = r.src.String()
	} else if ep, err := endpointOf(p.Source); err == nil {
		name = ep.String()
	}
	return sharedfeed.Source{
		Key:         hex.EncodeToString(sum[:]),
		Name:        name,
		Style:       opts.Style,
		Heartbeat:   opts.Heartbeat,
		IncludeDocs: docs,
		Open: func(log zerolog.Logger) (*couch.DB, func(), error) {
			return openFeed(p, o, docs, log)
		},
	}
}

// openFeedDB opens the source of p for a shared feed, with connections of
// its own (a job's lease ends with the job; the feed outlives it).
func openFeedDB(p Params, o Options, log zerolog.Logger) (*couch.DB, func(), error) {
	return openFeed(p, o, false, log)
}

// openFeed is openFeedDB for a feed with documents (docs) or without: one
// with documents takes rows up to max_document_bytes (a row is then a
// document) when that is more than max_changes_row_bytes.
func openFeed(p Params, o Options, docs bool, log zerolog.Logger) (*couch.DB, func(), error) {
	ep, err := endpointOf(p.Source)
	if err != nil {
		return nil, nil, err
	}
	client, release := o.HTTPClient, func() {}
	if o.Clients != nil || client == nil {
		to, err := TransportOptions(p, p.Source, o.Endpoints)
		if err != nil {
			return nil, nil, err
		}
		to.BufferSize = connBufferSize
		tr, err := couch.NewTransport(to)
		if err != nil {
			return nil, nil, err
		}
		tr.MaxConnsPerHost = 2
		var rt http.RoundTripper = tr
		if o.FeedTransport != nil {
			rt = o.FeedTransport(tr)
		}
		client, release = &http.Client{Transport: rt}, tr.CloseIdleConnections
	}
	lim := o.Limiter
	if lim == nil {
		lim = NewRateLimiter(time.Now)
	}
	limits := o.Limits
	limits.ReadTimeout = p.ConnectionTimeout
	if docs {
		limits.MaxLineBytes = max(limits.MaxLineBytes, limits.MaxDocumentBytes)
	}
	return couch.NewDB(ep, couch.Options{Logger: log, Retries: p.RetriesPerRequest, RetryBackoff: o.RetryBackoff,
		Limiter: lim, Session: o.sessionOptions(), Tokens: o.Endpoints.tokenOptions(), ErrorBudget: o.Endpoints.errorBudget(),
		Limits: limits, HTTPClient: client, RequestTimeout: o.Endpoints.RequestTimeout}), release, nil
}

// shared reads the changes through the node's shared feed: join, then
// join again after the subscription ends, until ctx is done or the feed
// failed for good.
//
// The first join hands the hub the source's update_seq the run read at its
// start (moments ago): a feed it opens starts there instead of reading the
// source's info again. Later joins (after an overflow or a failure) let
// the feed read it: the run's is old by then.
func (cr *changesReader) shared(ctx context.Context) error {
	src := cr.s.r.feedSource()
	src.Start = cr.s.sourceSeq
	for !cr.done {
		err := cr.join(ctx, src)
		src.Start = nil
		if err != nil {
			return err
		}
	}
	return nil
}

// join subscribes to the shared feed, catches up from since with a one-shot
// request of its own (filtered as the job's own feed would be), then hands
// the subscription's rows to the batcher, skipping those the catch-up
// delivered, until the subscription ends: an overflow joins again at once,
// a feed failure goes through the job's own retries and backoff (failed).
func (cr *changesReader) join(ctx context.Context, src sharedfeed.Source) error {
	r := cr.s.r
	cr.got, cr.began = 0, time.Now()
	filter, err := r.feedFilter()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrChangesFailed, err) // sharesFeed said it could
	}
	sub, err := r.o.Feeds.Subscribe(ctx, src, filter)
	if ctx.Err() != nil {
		cr.done = true
		return nil
	}
	if err != nil {
		return cr.failed(ctx, err)
	}
	defer sub.Close()

	var caught bool
	if from, ok := sub.From(); ok && seqAtOrBefore(from, cr.since) {
		// The subscription hands over every row after cr.since: a
		// catch-up would read nothing (the source has no change after the
		// checkpoint, or the feed starts at it).
		caught = true
		cr.s.feedRead(couch.FeedEnd{LastSeq: cr.since}, true)
	} else {
		caught, err = cr.catchUp(r.gated(ctx))
	}
	cr.s.startupDone() // caught up, or failed: the start-up is over either way
	if !caught {
		return err // join again (after failed's pause), stop, or give up
	}
	caughtUp := cr.since
	cr.got, cr.began = 0, time.Now()
	cr.s.park.feedLive(true)
	defer cr.s.park.feedLive(false)
	for {
		rows, err := sub.Next(ctx)
		if ctx.Err() != nil {
			cr.done = true
			return nil
		}
		if errors.Is(err, sharedfeed.ErrOverflow) {
			r.log.Debug().Msg("replication: fell behind the shared feed, catching up on its own")
			return nil
		}
		if err != nil {
			return cr.failed(ctx, err)
		}
		for _, c := range rows {
			if caughtUp != nil && !seqAfter(c.Seq, caughtUp) {
				continue // the catch-up delivered it
			}
			caughtUp = nil
			if err := cr.onRow(c); err != nil {
				cr.done = true // the run is stopping
				return nil
			}
			if c.Seq != nil {
				cr.since = c.Seq
			}
		}
	}
}

// catchUp reads the changes since cr.since with one-shot requests of the
// job's own: one for doc_ids (which may be filtered here, where limit=
// would count unfiltered rows), pages as a one-shot replication's
// otherwise (a server that builds the whole answer first, as PouchDB Server
// does, would make a long first catch-up one huge response). A selector job
// asks Apache CouchDB for filter=_selector (serverFiltersSelectors); from
// any other server it reads include_docs=true and matches each row here as
// its subscription does (PouchDB Server answers filter=_selector with a 404
// and exits). It reports whether it read up to the end; if not, the error
// is failed's.
func (cr *changesReader) catchUp(ctx context.Context) (bool, error) {
	r := cr.s.r
	pages := pager{}
	if r.p.DocIDs == nil {
		pages = pager{limit: r.p.WorkerBatchSize, max: r.p.WorkerBatchSize * pageMaxBatches}
	}
	// rows counts the rows read (a page's size), matched or not.
	rows := 0
	var sel *mango.Selector
	if r.p.Selector != nil && !cr.serverFiltersSelectors(ctx) {
		filter, err := r.feedFilter()
		if err != nil {
			return false, fmt.Errorf("%w: %w", ErrChangesFailed, err)
		}
		sel = filter.Selector
	}
	onRow := func(c couch.Change) error {
		rows++
		if sel != nil {
			var ok bool
			if c, ok = sharedfeed.MatchRow(c, sel); !ok {
				return nil
			}
		}
		return cr.onRow(c)
	}
	for {
		r.changesOptions(&cr.opts, cr.since)
		cr.opts.Feed, cr.opts.Heartbeat, cr.opts.Limit = couch.FeedNormal, 0, pages.limit
		if sel != nil {
			cr.opts.Selector, cr.opts.IncludeDocs = nil, true
		}
		before := rows
		end, err := r.src.ReadChangesEnd(ctx, &cr.opts, onRow)
		if ctx.Err() != nil {
			cr.done = true
			return false, nil
		}
		if end.LastSeq != nil {
			cr.since = end.LastSeq
		}
		if err != nil {
			return false, cr.failed(ctx, err)
		}
		// Each page's "pending" (CouchDB's) is the job's changes_pending;
		// the last page, read to the end, leaves nothing pending.
		more := pages.more(rows - before)
		cr.s.feedRead(end, !more)
		if !more {
			// The end moves through_seq to last_seq, as the end of a
			// continuous feed of the job's own does: a filtered job whose
			// rows are rare checkpoints past the rows its filter dropped,
			// and its next catch-up (after a restart or a wake-up) reads
			// from there, not from its last matching row.
			if err := cr.bt.end(cr.since, true); err != nil {
				cr.done = true // the run is stopping
				return false, nil
			}
			return true, nil
		}
	}
}

// serverFiltersSelectors reports whether a selector job's catch-up asks
// the source for filter=_selector: when it is Apache CouchDB (GET /
// answers "couchdb": "Welcome"). A catch-up may read the source's whole
// history (a job's first start: from 0): the server's filter sends the
// matching rows only, where the node would read every document, once per
// job (10,000 fan-out jobs: 10,000 times the central database). Any other
// server, or one whose root cannot be read, gets include_docs and the
// node's filter: PouchDB Server answers filter=_selector with a 404 and
// exits. The shared feed the job follows afterwards is node-evaluated
// either way (one read of each document for all the jobs).
func (cr *changesReader) serverFiltersSelectors(ctx context.Context) bool {
	r := cr.s.r
	info, err := r.o.Infos.serverInfo(ctx, r.p.Source, r.src)
	if err != nil {
		cr.s.r.log.Debug().Err(err).Msg("replication: the source's root cannot be read: its selector is evaluated on the node")
		return false
	}
	return info.CouchDB == "Welcome"
}

// seqAtOrBefore reports whether seq a is known to be at or before b: the
// same seq (0 is the zero seq), both numbers and a ≤ b, or a is the
// start of the database (CouchDB's "0-…": its number is the sum of its
// shards' seqs, so every shard is at 0). Other opaque seqs (CouchDB's)
// that differ are not known to be.
func seqAtOrBefore(a, b couch.Seq) bool {
	if a.Equal(b) {
		return true
	}
	if n, ok := seqNumber(a); ok && n == 0 {
		return true
	}
	x, ok1 := a.Int()
	y, ok2 := b.Int()
	return ok1 && ok2 && x <= y
}

// seqAfter reports whether a is after b; seqs that are not numbers (opaque,
// as CouchDB's) are taken to be after, so a row is delivered twice rather
// than lost (a duplicate row costs a _revs_diff entry, nothing more).
func seqAfter(a, b couch.Seq) bool {
	if a.IsZero() {
		return true
	}
	x, ok1 := a.Int()
	y, ok2 := b.Int()
	return !ok1 || !ok2 || x > y
}
