package postgres

import (
	"context"
	"fmt"
	"time"

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
// one round trip on its connection, couchrep_kv_lock and one
// couchrep_kv_apply per transaction (each validates against everything
// committed before it, the earlier ones of the batch included, and
// returns false on a conflict without writing), as one implicit
// transaction committed by the pipeline's Sync. Transactions
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
	// In commit order, before anyone learns the outcome (cache.go).
	if err != nil {
		db.cache.purge()
	} else {
		db.cache.committed(version, batch)
	}
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
	calls := make([]call, 0, len(batch)+2)
	if t.open || t.dirty {
		calls = append(calls, call{sql: "ROLLBACK"}) // the leader's snapshot (or the connection's last one)
	}
	// No BEGIN and COMMIT: the statements of a batch up to its Sync (one
	// per round trip) run in one implicit transaction, which commits at
	// the Sync, or rolls back, with every statement after the failed one
	// skipped, on an error. Two statements fewer per batch for both
	// sides, and a failed batch leaves its connection usable.
	var version int64
	calls = append(calls, call{sql: lockSQL, row: func(vals [][]byte) (err error) {
		version, err = decodeInt8(vals[0])
		return err
	}})
	results := 0
	for i, r := range batch {
		sql := fastApplySQL
		if !r.args.fast() {
			sql = applySQL
		}
		calls = append(calls, call{sql: sql, apply: r.args, order: int32(i), row: func(vals [][]byte) (err error) {
			results++
			if r.ok, err = decodeBool(vals[0]); err == nil {
				r.xv, err = decodeByteaArray(vals[1])
			}
			return err
		}})
	}
	db.rt.Add(1)
	err := run(ctx, t.conn.Conn(), calls)
	if err == nil {
		t.open, t.dirty = false, false
		if results != len(batch) {
			err = fmt.Errorf("postgres: %d apply results for %d transactions", results, len(batch))
		}
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

// lockSQL is couchrep_kv_lock (schema 2) as one statement, without
// PL/pgSQL: the batch's commit version, taking the meta row's lock, and
// every 1,024 versions the pruning of the clears log.
const lockSQL = `WITH u AS (UPDATE couchrep_kv_meta SET cur = cur + 1,
	gc = CASE WHEN (cur + 1) % 1024 = 0 THEN greatest(gc, cur + 1 - 100000) ELSE gc END
	WHERE id = 1 RETURNING cur, gc),
d AS (DELETE FROM couchrep_kv_clears WHERE (SELECT cur FROM u) % 1024 = 0 AND ver <= (SELECT gc FROM u))
SELECT cur FROM u`

// fastApplySQL is couchrep_kv_apply in one statement, without PL/pgSQL,
// for the transactions that clear no range and add to no counter (every
// job queue transaction but a few): validate against every earlier
// commit, and only if that holds, clear, log the clears, write the sets,
// versionstamped keys and values, and notify. A PL/pgSQL call runs up to
// ten statements, each with its own executor start; this is one (a
// job cycle's three commits: see BENCHMARKS.md "PostgreSQL"). Its data-
// modifying parts all see the statement's snapshot, so a key must not be
// both cleared and written in it: kvbuf keeps one operation per key, and
// range clears (which may cover a written key) take the function.
// Parameters: $1 order in the batch, $2 snapshot version, $3 read keys,
// $4/$5 read ranges, $6 cleared keys, $7/$8 sets, $9/$10/$11
// versionstamped keys (key, offset, value), $12/$13/$14 versionstamped
// values (key, offset, value), $15 the NOTIFY payload.
const fastApplySQL = `WITH m AS (SELECT cur, gc FROM couchrep_kv_meta WHERE id = 1),
ok AS (SELECT (cardinality($3::bytea[]) = 0 AND cardinality($4::bytea[]) = 0) OR (
	$2::bigint >= (SELECT gc FROM m)
	AND NOT EXISTS (SELECT 1 FROM couchrep_kv WHERE k = ANY ($3::bytea[]) AND ver > $2::bigint)
	AND NOT EXISTS (SELECT 1 FROM unnest($4::bytea[], $5::bytea[]) AS r(b, e)
		WHERE EXISTS (SELECT 1 FROM couchrep_kv kv WHERE kv.k >= r.b AND kv.k < r.e AND kv.ver > $2::bigint))
	AND NOT EXISTS (SELECT 1 FROM couchrep_kv_clears c WHERE c.ver > $2::bigint
		AND (EXISTS (SELECT 1 FROM unnest($3::bytea[]) AS x(k) WHERE x.k >= c.b AND x.k < c.e)
			OR EXISTS (SELECT 1 FROM unnest($4::bytea[], $5::bytea[]) AS r(b, e) WHERE r.b < c.e AND c.b < r.e)))
	) AS ok),
st AS (SELECT int8send((SELECT cur FROM m)) || int2send($1::smallint) AS s),
del AS (DELETE FROM couchrep_kv WHERE k = ANY ($6::bytea[]) AND (SELECT ok FROM ok)),
clr AS (INSERT INTO couchrep_kv_clears SELECT (SELECT cur FROM m), x.k, x.k || '\x00'::bytea
	FROM unnest($6::bytea[]) AS x(k) WHERE (SELECT ok FROM ok)),
xv AS (SELECT x.k, overlay(x.v PLACING (SELECT s FROM st) FROM x.o + 1) AS v, x.n
	FROM unnest($12::bytea[], $13::int[], $14::bytea[]) WITH ORDINALITY AS x(k, o, v, n)),
ins AS (INSERT INTO couchrep_kv (k, v, ver)
	SELECT w.k, w.v, (SELECT cur FROM m) FROM (
		SELECT x.k, x.v FROM unnest($7::bytea[], $8::bytea[]) AS x(k, v)
		UNION ALL SELECT overlay(x.k PLACING (SELECT s FROM st) FROM x.o + 1), x.v
			FROM unnest($9::bytea[], $10::int[], $11::bytea[]) AS x(k, o, v)
		UNION ALL SELECT xv.k, xv.v FROM xv) AS w
	WHERE (SELECT ok FROM ok)
	ON CONFLICT (k) DO UPDATE SET v = excluded.v, ver = excluded.ver)
SELECT ok.ok, CASE WHEN ok.ok THEN ARRAY(SELECT xv.v FROM xv ORDER BY xv.n) END,
	CASE WHEN ok.ok AND $15::text IS NOT NULL THEN pg_notify('couchrep_kv', $15::text) END IS NULL
FROM ok`

// fast reports whether the transaction's commit can take fastApplySQL.
func (a *commitArgs) fast() bool { return len(a.cb) == 0 && len(a.ak) == 0 }

// size is about how many bytes encode appends.
func (a *commitArgs) size() int {
	n := 64 + 28*len(a.vo) + 28*len(a.xo)
	for _, x := range [...][][]byte{a.rk, a.rb, a.re, a.cb, a.ce, a.ck, a.sk, a.sv, a.ak, a.ad, a.vk, a.vv, a.xk, a.xv} {
		n += arraySize(x)
	}
	if a.note != nil {
		n += len(*a.note)
	}
	return n
}

// encode appends the apply statement's parameters (fastApplySQL's, or
// applySQL's unless fast) to buf, as encodeParams does: the order in the
// batch first.
func (a *commitArgs) encode(order int32, oids []uint32, buf []byte) ([]byte, [][]byte, error) {
	if a.fast() {
		args := [...]any{order, a.snapVersion, a.rk, a.rb, a.re, a.ck, a.sk, a.sv, a.vk, a.vo, a.vv, a.xk, a.xo, a.xv, a.note}
		return encodeParams(oids, args[:], buf)
	}
	args := [...]any{order, a.snapVersion, a.rk, a.rb, a.re, a.cb, a.ce, a.ck, a.sk, a.sv, a.ak, a.ad,
		a.vk, a.vo, a.vv, a.xk, a.xo, a.xv, a.note}
	return encodeParams(oids, args[:], buf)
}
