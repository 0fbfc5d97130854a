package replication

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
)

// rowsReadAhead bounds the rows the changes reader decodes ahead of the
// batcher.
const rowsReadAhead = 64

// batchIdle flushes a partial batch when the feed has been quiet this long
// (continuous feeds, slow sources).
const batchIdle = 20 * time.Millisecond

// changesOptions builds the _changes request for the job's filters.
func (r *Replication) changesOptions(since couch.Seq) couch.ChangesOptions {
	o := couch.ChangesOptions{Feed: couch.FeedNormal, Since: since, Style: couch.StyleAllDocs}
	if r.p.WinningRevsOnly {
		o.Style = couch.StyleMainOnly
	}
	if r.p.Continuous {
		o.Feed = couch.FeedContinuous
		o.Timeout = max(time.Second, r.p.ConnectionTimeout/3)
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
	return o
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
// read in one request, as before.
type pager struct {
	limit, max int // 0: no paging
}

func newPager(p Params) pager {
	if p.Continuous || p.DocIDs != nil {
		return pager{}
	}
	return pager{limit: p.WorkerBatchSize, max: p.WorkerBatchSize * pageMaxBatches}
}

// more reports whether another page follows a page of got rows, and sizes it.
func (pg *pager) more(got int) bool {
	if pg.limit == 0 || got < pg.limit {
		return false
	}
	pg.limit = min(pg.limit*pageGrowth, pg.max)
	return true
}

// readChanges is the changes reader plus the changes manager: it reads the
// feed (re-requesting a continuous feed from its last seq forever) and
// hands out batches of worker_batch_size rows, each registered with the
// seq tracker in feed order. A feed's end is marked by a change-less batch
// carrying last_seq, so through_seq reaches it once all earlier batches
// are done.
func (s *runState) readChanges(ctx context.Context, out chan<- batch) error {
	r := s.r
	// A short read-ahead is enough: the batcher only appends. (A whole
	// batch of buffered rows, 36 KB at worker_batch_size 500, was most of an
	// idle continuous job's memory.)
	rows := make(chan couch.Change, min(r.p.WorkerBatchSize, rowsReadAhead))
	type feedEnd = struct{ seq couch.Seq }
	ends := make(chan feedEnd) // unbuffered: a feed end is taken only after its rows
	batcherErr := make(chan error, 1)

	go func() {
		batcherErr <- s.batcher(ctx, rows, ends, out)
	}()
	// The batcher owns rows/ends; marks are sent through ends after the
	// rows of the same feed (ends is drained only when rows is empty).
	sendEnd := func(seq couch.Seq) error {
		select {
		case ends <- feedEnd{seq}:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	err := func() error {
		since := s.startSeq
		failures := 0
		wait := r.o.RetryBackoff
		if wait <= 0 {
			wait = couch.DefaultRetryBackoff
		}
		pages := newPager(r.p)
		for {
			got := 0
			opts := r.changesOptions(since)
			opts.Limit = pages.limit
			last, err := r.src.Changes(ctx, opts, func(c couch.Change) error {
				got++
				select {
				case rows <- c:
					return nil
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			})
			if ctx.Err() != nil {
				return nil
			}
			if last != nil {
				since = last
			}
			if err == nil {
				failures = 0
				if pages.more(got) {
					continue
				}
				if err := sendEnd(since); err != nil {
					return nil
				}
				if !r.p.Continuous {
					return nil
				}
				continue
			}
			var herr *couch.HTTPError
			if errors.As(err, &herr) && !herr.Retryable() {
				return fmt.Errorf("%w: %w", ErrChangesFailed, err)
			}
			if got > 0 {
				failures = 0
			}
			failures++
			if failures > r.p.RetriesPerRequest {
				return fmt.Errorf("%w: after %d attempts: %w", ErrChangesFailed, failures, err)
			}
			r.log.Warn().Err(err).Int("attempt", failures).Str("since", seqOrZero(since).String()).
				Msg("replication: changes feed failed, resuming")
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil
			}
			wait = min(wait*2, 5*time.Minute)
		}
	}()
	close(rows)
	berr := <-batcherErr
	if err != nil {
		return err
	}
	return berr
}

func (s *runState) batcher(ctx context.Context, rows <-chan couch.Change, ends <-chan struct{ seq couch.Seq }, out chan<- batch) error {
	size := s.r.p.WorkerBatchSize
	// cur is allocated by the first row of a batch: an idle continuous
	// feed holds no batch buffer (worker_batch_size rows are 36 KB).
	var cur []couch.Change
	idle := time.NewTimer(time.Hour)
	idle.Stop()
	emit := func(changes []couch.Change, seq couch.Seq) error {
		s.mu.Lock()
		n := s.tracker.start(seq)
		s.mu.Unlock()
		select {
		case out <- batch{n: n, changes: changes, seq: seq}:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
	flush := func() error {
		if len(cur) == 0 {
			return nil
		}
		b := cur
		cur = nil
		return emit(b, b[len(b)-1].Seq)
	}
	for {
		var c couch.Change
		var ok bool
		select {
		case c, ok = <-rows:
		default:
			// Nothing buffered: a feed end may be pending, else wait.
			select {
			case c, ok = <-rows:
			case e := <-ends:
				if err := flush(); err != nil {
					return err
				}
				if err := emit(nil, e.seq); err != nil {
					return err
				}
				continue
			case <-idle.C:
				if err := flush(); err != nil {
					return err
				}
				continue
			case <-ctx.Done():
				return nil
			}
		}
		if !ok {
			return nil
		}
		if c.Seq == nil && len(cur) > 0 {
			c.Seq = cur[len(cur)-1].Seq
		}
		if cur == nil {
			cur = make([]couch.Change, 0, size)
		}
		cur = append(cur, c)
		if len(cur) >= size {
			if err := flush(); err != nil {
				return err
			}
			continue
		}
		idle.Reset(batchIdle)
	}
}
