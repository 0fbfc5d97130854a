package park

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
)

// Batched rechecks: a hibernated job's recheck is a read of its source
// database's info (what GET /db gives: update_seq, or not_found), which
// needs no actor. Rechecks.Look queues it by its server (Server.Key: the
// server's root and the credentials); the node's one batcher sends, at the
// node's pace (one request per Wait), one POST /_dbs_info for up to
// couch.MaxDBsInfoKeys (100) queued looks of a server, and hands each look
// its database's line. A look waits at most half its job's park_recheck
// (DefaultGather at most) for others of its server to join it: the
// recheck comes between half and twice park_recheck after the last. A server that has no _dbs_info (PouchDB Server answers 404; a
// CouchDB 3 answers 401 to credentials that are not a server admin's) gets
// a GET /db per look instead, decided at its first batch and remembered
// (NoBatchFor); a look alone in its batch is a GET /db too.

// Server is the server side of batched rechecks: a client of one source
// server with one set of credentials (a *dbupdates.Watch's feed is one).
type Server interface {
	// Key identifies the server and credentials: looks with equal keys
	// may go in one request. Never logged.
	Key() string
	// DBsInfo reads the infos of dbs in one request (POST /_dbs_info).
	DBsInfo(ctx context.Context, dbs []string) ([]couch.DBsInfoResult, error)
	// InfoOf reads one database's info (GET /db).
	InfoOf(ctx context.Context, db string) (couch.DBInfo, error)
}

// Defaults of the batcher.
const (
	// DefaultGather is the longest a look waits for others of its
	// server to join its batch (half its job's park_recheck if shorter).
	DefaultGather = 10 * time.Second
	// NoBatchFor is how long a server found without _dbs_info gets a
	// GET /db per look before it is asked again.
	NoBatchFor = time.Hour
	// lookTimeout bounds one request of the batcher.
	lookTimeout = 30 * time.Second
	// maxNoBatch bounds the servers remembered without _dbs_info.
	maxNoBatch = 10000
)

// LookStats counts the batcher's work.
type LookStats struct {
	// Looks is the looks answered; Batches the POST /_dbs_info requests
	// that answered some; Singles the GET /db requests.
	Looks, Batches, Singles uint64
	// NoBatch counts the servers found without _dbs_info.
	NoBatch uint64
}

// look is one queued recheck.
type look struct {
	db   string
	due  time.Time
	done func(couch.DBInfo, error)
}

// lookQueue is one server's queued looks.
type lookQueue struct {
	srv   Server
	looks []look
}

// batcher is the state of Rechecks' batched looks.
type batcher struct {
	mu      sync.Mutex
	queues  map[string]*lookQueue
	running bool
	kick    chan struct{}
	noBatch map[string]time.Time // key → until

	looks, batches, singles, noBatches atomic.Uint64
}

func (b *batcher) init() {
	if b.queues == nil {
		b.queues = map[string]*lookQueue{}
		b.noBatch = map[string]time.Time{}
		b.kick = make(chan struct{}, 1)
	}
}

// Look queues a recheck of db on srv: done gets what GET /db would give
// (its info, or its error: one matching couch.ErrNotFound for a database
// that does not exist), once, on the batcher's goroutine (it must return
// at once). period is the job's park_recheck: the look waits at most
// half of it (DefaultGather at most) for others of srv to join it, then
// for the node's pace (Wait). A nil Rechecks reads at once, unpaced.
func (r *Rechecks) Look(srv Server, db string, period time.Duration, done func(couch.DBInfo, error)) {
	if r == nil {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), lookTimeout)
			defer cancel()
			done(srv.InfoOf(ctx, db))
		}()
		return
	}
	b := &r.b
	key := srv.Key()
	b.mu.Lock()
	b.init()
	gather := r.gather
	if gather <= 0 {
		gather = DefaultGather
	}
	gather = min(gather, period/2)
	now := time.Now()
	if until, ok := b.noBatch[key]; ok && now.Before(until) {
		gather = 0 // one request per look anyway: no reason to wait
	}
	q := b.queues[key]
	if q == nil {
		q = &lookQueue{srv: srv}
		b.queues[key] = q
	}
	q.looks = append(q.looks, look{db: db, due: now.Add(max(gather, 0)), done: done})
	start := !b.running
	b.running = true
	b.mu.Unlock()
	if start {
		go r.batchLoop()
	} else {
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
}

// LookStats returns the batcher's counters.
func (r *Rechecks) LookStats() LookStats {
	if r == nil {
		return LookStats{}
	}
	return LookStats{Looks: r.b.looks.Load(), Batches: r.b.batches.Load(), Singles: r.b.singles.Load(),
		NoBatch: r.b.noBatches.Load()}
}

// next picks the queue whose batch goes next: one full batch, else the
// one whose oldest look is due first; nil when none is queued. b.mu held.
func (b *batcher) next() (*lookQueue, time.Time) {
	var q *lookQueue
	var due time.Time
	for _, x := range b.queues {
		if len(x.looks) >= couch.MaxDBsInfoKeys {
			return x, time.Time{}
		}
		if d := x.looks[0].due; q == nil || d.Before(due) {
			q, due = x, d
		}
	}
	return q, due
}

// batchLoop sends the queued looks, one request per pace, until none is
// queued.
func (r *Rechecks) batchLoop() {
	b := &r.b
	for {
		b.mu.Lock()
		q, due := b.next()
		if q == nil {
			b.running = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		if d := time.Until(due); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-b.kick: // another look queued: maybe a full batch now
				t.Stop()
				continue
			}
		}
		_ = r.Wait(context.Background())
		b.mu.Lock()
		key := q.srv.Key()
		n := min(len(q.looks), couch.MaxDBsInfoKeys)
		until, nob := b.noBatch[key]
		nob = nob && time.Now().Before(until)
		if nob {
			n = min(n, 1)
		}
		batch := make([]look, n)
		copy(batch, q.looks)
		q.looks = append(q.looks[:0:0], q.looks[n:]...)
		if len(q.looks) == 0 {
			delete(b.queues, key)
		}
		b.mu.Unlock()
		if n > 0 {
			r.send(q.srv, batch)
		}
	}
}

// send answers batch: one POST /_dbs_info, or a GET /db for a look alone.
// A server that has no _dbs_info is remembered, and the batch's looks go
// back to the queue's head (a GET /db each, paced).
func (r *Rechecks) send(srv Server, batch []look) {
	b := &r.b
	ctx, cancel := context.WithTimeout(context.Background(), lookTimeout)
	defer cancel()
	if len(batch) == 1 {
		b.singles.Add(1)
		info, err := srv.InfoOf(ctx, batch[0].db)
		b.looks.Add(1)
		batch[0].done(info, err)
		return
	}
	dbs := make([]string, 0, len(batch))
	at := make(map[string]int, len(batch))
	for _, l := range batch {
		if _, ok := at[l.db]; !ok {
			at[l.db] = len(dbs)
			dbs = append(dbs, l.db)
		}
	}
	res, err := srv.DBsInfo(ctx, dbs)
	if err == nil && len(res) != len(dbs) {
		err = errors.New("park: _dbs_info answered another number of databases")
	}
	if err != nil && noDBsInfo(err) {
		b.noBatches.Add(1)
		b.mu.Lock()
		b.init()
		if len(b.noBatch) >= maxNoBatch {
			now := time.Now()
			for k, until := range b.noBatch {
				if !now.Before(until) {
					delete(b.noBatch, k)
				}
			}
		}
		key := srv.Key()
		b.noBatch[key] = time.Now().Add(NoBatchFor)
		q := b.queues[key]
		if q == nil {
			q = &lookQueue{srv: srv}
			b.queues[key] = q
		}
		now := time.Now()
		for i := range batch {
			batch[i].due = now
		}
		q.looks = append(batch, q.looks...)
		b.mu.Unlock()
		return
	}
	b.batches.Add(1)
	b.looks.Add(uint64(len(batch)))
	for _, l := range batch {
		if err != nil {
			l.done(couch.DBInfo{}, err)
			continue
		}
		x := res[at[l.db]]
		l.done(x.Info, x.Err)
	}
}

// noDBsInfo reports whether err says the server (or these credentials)
// cannot answer POST /_dbs_info: 400 (but too_many_keys), 401, 403, 404
// (PouchDB Server), 405, 501.
func noDBsInfo(err error) bool {
	var he *couch.HTTPError
	if !errors.As(err, &he) {
		return false
	}
	switch he.Status {
	case http.StatusBadRequest:
		return he.ErrorName != "too_many_keys"
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed,
		http.StatusNotImplemented:
		return true
	}
	return false
}
