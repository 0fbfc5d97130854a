package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/couchrep/couchrep/internal/kv"
)

// Group commit.
//
// Commits are serialized by the meta row's lock (couchrep_kv_lock), held
// from the version's increment to the end of the committing transaction.
// One lock holder per transaction makes every commit wait for the one
// before it, and on a loaded machine a lock holder that the OS deschedules
// stalls everyone. So the transactions of one DB that want to commit at
// the same time go together: the first becomes the leader and sends, in
// one round trip on its connection, BEGIN, couchrep_kv_lock, one
// couchrep_kv_apply per transaction (each validates against everything
// committed before it, the earlier ones of the batch included, and
// returns false on a conflict without writing) and COMMIT. Transactions
// arriving meanwhile queue for the next batch, led by the first of them.
// They share the commit version; their versionstamps are ordered by their
// place in the batch (FDB's batch order).

// maxLeaders is how many batches of one DB may be in flight at once. With
// 4, the next batch would already wait for the commit lock in the server
// while the previous one commits; measured with 8 workers it made batches
// smaller (6.3 round trips per cycle instead of 5.1) and was not faster
// (290-325 against 219-388 cycles/s, load 12-16), so one.
const maxLeaders = 1

// maxBatch bounds a batch (the 2-byte order of a versionstamp allows
// 65,536).
const maxBatch = 256

// batchTimeout bounds a batch's round trip: a commit once sent is not
// abandoned because one caller's context ended.
const batchTimeout = time.Minute

type commitReq struct {
	args *commitArgs
	done chan struct{}
	lead bool // woken to lead the next batch, not with a result

	version int64
	order   int
	ok      bool
	xv      [][]byte
	err     error
}

// commit commits t's buffered writes (args) with whatever else of this
// DB is committing, and returns the commit version, t's order in the
// batch and the versionstamped values written.
func (db *DB) commit(t *tx, a *commitArgs) (int64, int, [][]byte, error) {
	req := &commitReq{args: a, done: make(chan struct{})}
	db.cmu.Lock()
	lead := db.leaders < maxLeaders
	if lead {
		db.leaders++
	} else {
		db.queue = append(db.queue, req)
	}
	db.cmu.Unlock()
	if !lead {
		t.end() // the snapshot is not needed any more
		<-req.done
		if !req.lead {
			return req.result()
		}
		// Taken off the queue to lead the next batch.
		req.lead, req.done = false, make(chan struct{})
	}
	db.lead(t, req)
	<-req.done
	return req.result()
}

func (req *commitReq) result() (int64, int, [][]byte, error) {
	if req.err != nil {
		return 0, 0, nil, req.err
	}
	if !req.ok {
		return 0, 0, nil, fmt.Errorf("postgres: commit: %w", kv.ErrConflict)
	}
	return req.version, req.order, req.xv, nil
}

// lead sends mine and what is queued (up to maxBatch) as one batch,
// delivers the results and hands its leadership to the first request
// still queued, taking it off the queue: every request is in exactly one
// of the queue, a batch or a hand-over.
func (db *DB) lead(t *tx, mine *commitReq) {
	db.cmu.Lock()
	n := min(len(db.queue), maxBatch-1)
	batch := append([]*commitReq{mine}, db.queue[:n]...)
	db.queue = db.queue[n:]
	db.cmu.Unlock()

	version, err := db.sendBatch(t, batch)
	for i, r := range batch {
		r.version, r.order, r.err = version, i, err
	}
	db.cmu.Lock()
	var next *commitReq
	if len(db.queue) > 0 {
		next = db.queue[0]
		db.queue = db.queue[1:]
		next.lead = true
	} else {
		db.leaders--
	}
	db.cmu.Unlock()
	for _, r := range batch {
		close(r.done)
	}
	if next != nil {
		close(next.done)
	}
}

// sendBatch runs the batch in one round trip on t's connection (or a new
// one) and fills each request's outcome.
func (db *DB) sendBatch(t *tx, batch []*commitReq) (int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.ctx), batchTimeout)
	defer cancel()
	if t.conn == nil {
		c, dirty, err := db.acquire(ctx)
		if err != nil {
			return 0, err
		}
		t.conn, t.dirty = c, dirty
	}
	rollback := t.open || t.dirty
	b := &pgx.Batch{}
	if rollback {
		b.Queue("ROLLBACK") // the leader's snapshot (or the connection's last one)
	}
	b.Queue("BEGIN")
	b.Queue("SELECT couchrep_kv_lock()")
	for i, r := range batch {
		b.Queue(applySQL, append([]any{int32(i)}, r.args.args()...)...)
	}
	b.Queue("COMMIT")
	db.rt.Add(1)
	br := t.conn.SendBatch(ctx, b)
	var err error
	var version int64
	if rollback {
		_, err = br.Exec()
		t.open, t.dirty = false, false
	}
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		err = br.QueryRow().Scan(&version)
	}
	for _, r := range batch {
		if err != nil {
			break
		}
		err = br.QueryRow().Scan(&r.ok, &r.xv)
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		for _, r := range batch {
			r.ok = false
		}
		switch {
		case retryable(err):
			return 0, fmt.Errorf("postgres: commit: %w (%v)", kv.ErrConflict, err)
		case pgconn.SafeToRetry(err):
			return 0, db.errorf("commit", fmt.Errorf("%w: %w", errNotSent, err))
		}
		return 0, db.errorf("commit", err)
	}
	return version, nil
}

// acquire takes a connection: one parked by an ended snapshot (dirty: it
// must be sent ROLLBACK first) or one from the pool.
func (db *DB) acquire(ctx context.Context) (*pgxpool.Conn, bool, error) {
	select {
	case p := <-db.parked:
		return p.c, true, nil
	default:
	}
	c, err := db.pool.Acquire(ctx)
	if err != nil {
		if db.isClosed() {
			return nil, false, kv.ErrClosed
		}
		return nil, false, db.errorf("acquire connection", err)
	}
	return c, false, nil
}

// park keeps a connection whose snapshot transaction is still open for
// the next transaction, which ends it in its first round trip; the pool
// would drop a connection returned inside a transaction.
func (db *DB) park(c *pgxpool.Conn) {
	db.pmu.Lock()
	defer db.pmu.Unlock()
	if c.Conn().IsClosed() || db.isClosed() {
		c.Release()
		return
	}
	select {
	case db.parked <- parkedConn{c, time.Now()}:
	default:
		if _, err := c.Exec(context.Background(), "ROLLBACK"); err != nil {
			db.log.Debug().Err(db.errorf("end snapshot", err)).Msg("postgres: rollback")
		}
		c.Release()
	}
}

// unpark returns the parked connections to the pool (which drops them:
// they are inside a transaction).
func (db *DB) unpark() {
	db.pmu.Lock()
	defer db.pmu.Unlock()
	for {
		select {
		case p := <-db.parked:
			p.c.Release()
		default:
			return
		}
	}
}

type parkedConn struct {
	c  *pgxpool.Conn
	at time.Time
}

// sweep ends the snapshots of connections parked for longer than a
// second, so that an idle node holds no old snapshot (it would keep
// VACUUM from removing dead rows).
func (db *DB) sweep() {
	defer db.bg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-db.closed:
			return
		case <-tick.C:
		}
		for range len(db.parked) {
			var p parkedConn
			select {
			case p = <-db.parked:
			default:
			}
			if p.c == nil {
				break
			}
			if time.Since(p.at) < time.Second {
				select {
				case db.parked <- p: // young: keep it, with its age
					continue
				default:
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if _, err := p.c.Exec(ctx, "ROLLBACK"); err != nil {
				db.log.Debug().Err(db.errorf("end snapshot", err)).Msg("postgres: rollback")
			}
			cancel()
			p.c.Release()
		}
	}
}
