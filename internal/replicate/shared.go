package replicate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/sharedfeed"
)

// sharesFeed reports whether the run reads the node's shared feed of its
// source (Options.Feeds) instead of a continuous feed of its own. Only
// continuous replications whose filter the node applies exactly as the
// server would share: doc_ids (filter=_doc_ids lists the rows of those ids,
// which is the unfiltered feed's rows of those ids) and no filter at all.
// A selector (its result depends on the document's body, which the shared
// feed does not carry) and a named filter (server-side JavaScript with the
// job's query_params) read their own feed.
func (r *Replication) sharesFeed() bool {
	return r.o.Feeds != nil && r.p.Continuous && r.p.Selector == nil && r.p.Filter == ""
}

// feedSource is the shared feed this run subscribes to. Its key is a digest
// of everything that shapes the request and its connection: the source's
// URL with its credentials, headers and Basic auth, proxy, socket options,
// connection_timeout (the heartbeat), retries_per_request and the style.
// Jobs with other credentials never share a feed.
func (r *Replication) feedSource() sharedfeed.Source {
	p, o := r.p, r.o
	var opts couch.ChangesOptions
	r.changesOptions(&opts, nil)
	key, _ := json.Marshal(struct {
		Source            EndpointParams
		Socket            string
		ConnectionTimeout time.Duration
		Retries           int
		Style             string
	}{p.Source, p.SocketOptions, p.ConnectionTimeout, p.RetriesPerRequest, opts.Style})
	sum := sha256.Sum256(key)
	return sharedfeed.Source{
		Key:       hex.EncodeToString(sum[:]),
		Name:      r.src.String(),
		Style:     opts.Style,
		Heartbeat: opts.Heartbeat,
		Open: func(log zerolog.Logger) (*couch.DB, func(), error) {
			return openFeedDB(p, o, log)
		},
	}
}

// openFeedDB opens the source of p for a shared feed, with connections of
// its own (a job's lease ends with the job; the feed outlives it).
func openFeedDB(p Params, o Options, log zerolog.Logger) (*couch.DB, func(), error) {
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
	return couch.NewDB(ep, couch.Options{Logger: log, Retries: p.RetriesPerRequest, RetryBackoff: o.RetryBackoff,
		Limiter: lim, Session: o.Endpoints.sessionOptions(), ErrorBudget: o.Endpoints.errorBudget(),
		Limits: limits, HTTPClient: client, RequestTimeout: o.Endpoints.RequestTimeout}), release, nil
}

// shared reads the changes through the node's shared feed: join, then
// join again after the subscription ends, until ctx is done or the feed
// failed for good.
func (cr *changesReader) shared(ctx context.Context) error {
	src := cr.s.r.feedSource()
	for !cr.done {
		if err := cr.join(ctx, src); err != nil {
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
	sub, err := r.o.Feeds.Subscribe(ctx, src, r.p.DocIDs)
	if ctx.Err() != nil {
		cr.done = true
		return nil
	}
	if err != nil {
		return cr.failed(ctx, err)
	}
	defer sub.Close()

	if caught, err := cr.catchUp(ctx); !caught {
		return err // join again (after failed's pause), stop, or give up
	}
	caughtUp := cr.since
	cr.got, cr.began = 0, time.Now()
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
// does, would make a long first catch-up one huge response). It reports
// whether it read up to the end; if not, the error is failed's.
func (cr *changesReader) catchUp(ctx context.Context) (bool, error) {
	r := cr.s.r
	pages := pager{}
	if r.p.DocIDs == nil {
		pages = pager{limit: r.p.WorkerBatchSize, max: r.p.WorkerBatchSize * pageMaxBatches}
	}
	for {
		r.changesOptions(&cr.opts, cr.since)
		cr.opts.Feed, cr.opts.Heartbeat, cr.opts.Limit = couch.FeedNormal, 0, pages.limit
		got := cr.got
		end, err := r.src.ReadChangesEnd(ctx, &cr.opts, cr.onRow)
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
		more := pages.more(cr.got - got)
		cr.s.feedRead(end, !more)
		if !more {
			return true, nil
		}
	}
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
