package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
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
// the same time go together, as one batch: couchrep_kv_lock and one
// couchrep_kv_apply per transaction (each validates against everything
// committed before it, the earlier ones of the batch included, and
// returns false on a conflict without writing), as one implicit
// transaction committed by its Sync. They share the commit version; their
// versionstamps are ordered by their place in the batch (FDB's batch
// order).
//
// Batches go to the server on the DB's commit connection (pipe.go), up to
// maxInFlight at once: while the server runs one, the next is already in
// its socket, so the server goes from one batch to the next without
// waiting for this process to read the result and send again. The server
// runs them in the order sent, and their results come back in that order,
// so commit versions follow the send order and the commit cache (cache.go)
// is updated batch by batch in commit order. Transactions arriving while
// maxInFlight batches are in flight (or one is, and fewer than
// minPipelined wait) queue for the next one, which is sent as soon as one
// comes back.

// maxInFlight is how many batches of one DB may be in flight at once.
const maxInFlight = 2

// minPipelined is how many commits must be waiting for a batch to be sent
// while another is in flight; fewer wait for it to come back. A batch
// costs the commit connection's server process about as much fixed work
// (the lock statement, the commit, the round trip's system calls and
// wake-ups) as two or three applies, and that process is what limits a
// busy DB: with 8 workers (BenchmarkCycle), sending every waiting commit
// at once made batches of 1.9 transactions and 2,790-2,980 cycles/s; this
// makes batches of 2.6 and 3,005-3,098 (BENCHMARKS.md "The commit
// connection").
const minPipelined = 4

// maxBatch bounds a batch (the 2-byte order of a versionstamp allows
// 65,536).
const maxBatch = 256

// batchTimeout bounds a batch's round trip: a commit once sent is not
// abandoned because one caller's context ended.
const batchTimeout = time.Minute

type commitReq struct {
	args *commitArgs
	done chan struct{}

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
	t.end() // the snapshot is not needed any more
	req := &commitReq{args: a, done: make(chan struct{})}
	if t.prio {
		db.commitQ.addFront(req) // the liveness lane: ahead of the queued commits
	} else {
		db.commitQ.add(req)
	}
	db.sendNext()
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

// sendNext sends what is queued (up to maxBatch) as one batch, unless
// maxInFlight batches are in flight, or one is and fewer than
// minPipelined requests wait: every request is in exactly one of the
// queue or a batch.
func (db *DB) sendNext() {
	if batch := db.commitQ.take(maxInFlight, minPipelined); batch != nil {
		db.send(batch)
	}
}

// delivered ends a batch: its outcome (version or err, and each request's
// ok) goes to the commit cache, in commit order, then to its callers, and
// the next batch may go.
func (db *DB) delivered(batch []*commitReq, version int64, err error) {
	err = db.commitError(err)
	if err != nil {
		for _, r := range batch {
			r.ok = false
		}
		db.cache.purge()
	} else {
		db.cache.committed(version, batch)
	}
	for i, r := range batch {
		r.version, r.order, r.err = version, i, err
	}
	db.commitQ.ended()
	// What queued meanwhile goes first: the server is idle until it
	// arrives; the callers woken below have more to do before they commit
	// again.
	db.sendNext()
	for _, r := range batch {
		close(r.done)
	}
}

// commitError says what a failed batch means to its transactions: a
// conflict to retry, a commit that provably did not happen, or an unknown
// outcome.
func (db *DB) commitError(err error) error {
	switch {
	case err == nil:
		return nil
	case retryable(err):
		return fmt.Errorf("postgres: commit: %w (%v)", kv.ErrConflict, err)
	case pgconn.SafeToRetry(err):
		return db.errorf("commit", fmt.Errorf("%w: %w", errNotSent, err))
	}
	return db.errorf("commit", err)
}

// batchCalls are the statements of a batch: the lock, whose row is the
// commit version, and one apply per request, whose row is its outcome.
func (db *DB) batchCalls(batch []*commitReq, version *int64) []call {
	calls := make([]call, 0, len(batch)+2)
	// The lock is a statement of its own, not a part of the first apply:
	// a statement's snapshot is taken when it starts, before the wait
	// for the lock, so the validation of a statement that took the lock
	// itself would miss the commits of other processes it waited for.
	if db.pruneDue.Swap(false) {
		calls = append(calls, call{sql: pruneSQL})
	}
	calls = append(calls, call{sql: lockSQL, row: func(vals [][]byte) (err error) {
		if *version, err = decodeInt8(vals[0]); err == nil && *version%pruneEvery == 0 {
			db.pruneDue.Store(true)
		}
		return err
	}})
	for i, r := range batch {
		sql := applySQL
		if r.args.fast() {
			sql = fastApplyFor(r.args.shape())
		}
		calls = append(calls, call{sql: sql, apply: r.args, order: int32(i), row: func(vals [][]byte) (err error) {
			if r.ok, err = decodeBool(vals[0]); err == nil {
				r.xv, err = decodeByteaArray(vals[1])
			}
			return err
		}})
	}
	return calls
}

// acquire takes a connection: one parked by an ended snapshot (dirty: it
// must be sent ROLLBACK first) or one from the pool, whichever comes
// first; for a transaction of the liveness lane (prio), one of the
// lane's. A transaction waiting for the pool also takes a connection
// parked while it waits: when the pool was full, every connection ended
// up parked (a transaction parks its connection at its end) while the
// waiters slept in the pool's queue until the sweep released the parked
// ones a second later, and a node starting hundreds of jobs ran 16
// transactions a second.
func (db *DB) acquire(ctx context.Context, prio bool) (*pgxpool.Conn, bool, error) {
	if prio {
		c, err := db.lane.Acquire(ctx)
		return c, false, db.acquireError(err)
	}
	select {
	case p := <-db.parked:
		return p.c, true, nil
	default:
	}
	actx, cancel := context.WithCancel(ctx)
	got := make(chan acquired, 1)
	go func() {
		c, err := db.pool.Acquire(actx)
		got <- acquired{c, err}
	}()
	select {
	case r := <-got:
		cancel()
		return r.c, false, db.acquireError(r.err)
	case p := <-db.parked:
		cancel()
		go func() {
			// The pool's connection, if it came anyway, goes back.
			if r := <-got; r.c != nil {
				r.c.Release()
			}
		}()
		return p.c, true, nil
	}
}

// acquired is a connection from the pool, or why none came.
type acquired struct {
	c   *pgxpool.Conn
	err error
}

func (db *DB) acquireError(err error) error {
	if err == nil {
		return nil
	}
	if db.isClosed() {
		return kv.ErrClosed
	}
	return db.errorf("acquire connection", err)
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

// rollback ends the snapshot on c at once and returns c to its pool (the
// liveness lane's connections: never parked).
func (db *DB) rollback(c *pgxpool.Conn) {
	if !c.Conn().IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
			db.log.Debug().Err(db.errorf("end snapshot", err)).Msg("postgres: rollback")
		}
		cancel()
	}
	c.Release()
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
// PL/pgSQL and without its pruning: the batch's commit version, taking
// the meta row's lock, and every pruneEvery versions moving gc.
const lockSQL = `UPDATE couchrep_kv_meta SET cur = cur + 1,
	gc = CASE WHEN (cur + 1) % 1024 = 0 THEN greatest(gc, cur + 1 - 100000) ELSE gc END
	WHERE id = 1 RETURNING cur`

// pruneEvery: the commit whose version is a multiple of it moves gc (the
// oldest version a transaction's snapshot may have to be validated) to
// 100,000 versions behind, and the DB that made it prunes the clears log
// to gc at the start of its next batch (pruneSQL). The lock statement
// did it itself, and the server started that DELETE's executor at every
// batch on the commit connection, the bottleneck of a busy DB. If the DB
// closes first, the next multiple's pruning removes those entries too.
const pruneEvery = 1024

// pruneSQL prunes the clears log to gc.
const pruneSQL = "DELETE FROM couchrep_kv_clears WHERE ver <= (SELECT gc FROM couchrep_kv_meta WHERE id = 1)"

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
// values (key, offset, value), $15 the NOTIFY payload, $16/$17 point
// reads whose key had a value / had none at the snapshot.
//
// A transaction runs the variant of it with only the parts its shape
// needs (fastApply): the server starts an executor for every part of a
// statement, used or not, and that start was the largest share of the
// commit connection's CPU (BENCHMARKS.md "The commit connection"). This
// is the variant with every part, whose parameter types all variants
// take.
var fastApplySQL = fastApply(shapeAll)

// A transaction's shape: which of its commit's parts are not empty.
const (
	shapeReads    = 1 << iota // point reads ($3)
	shapeRanges               // range reads ($4, $5)
	shapeClears               // cleared keys ($6)
	shapeSets                 // sets ($7, $8)
	shapeVSKeys               // versionstamped keys ($9..$11)
	shapeVSValues             // versionstamped values ($12..$14)
	shapeNote                 // a NOTIFY payload ($15)
	shapePresent              // point reads that found a value ($16)
	shapeAbsent               // point reads that found none ($17)
	shapeAll      = 1<<iota - 1
)

// shape is a's shape (for fast transactions).
func (a *commitArgs) shape() int {
	var sh int
	for _, p := range [...]struct {
		bit int
		on  bool
	}{
		{shapeReads, len(a.rk) > 0}, {shapeRanges, len(a.rb) > 0}, {shapeClears, len(a.ck) > 0},
		{shapeSets, len(a.sk) > 0}, {shapeVSKeys, len(a.vk) > 0}, {shapeVSValues, len(a.xk) > 0},
		{shapeNote, a.note != nil}, {shapePresent, len(a.rkp) > 0}, {shapeAbsent, len(a.rka) > 0},
	} {
		if p.on {
			sh |= p.bit
		}
	}
	return sh
}

var fastApplies struct {
	sync.Mutex
	sql [shapeAll + 1]string
}

// fastApplyFor is the apply statement for shape, made once.
func fastApplyFor(shape int) string {
	fastApplies.Lock()
	defer fastApplies.Unlock()
	if fastApplies.sql[shape] == "" {
		fastApplies.sql[shape] = fastApply(shape)
	}
	return fastApplies.sql[shape]
}

// fastApply writes the apply statement of the transactions of shape.
func fastApply(shape int) string {
	has := func(bit int) bool { return shape&bit != 0 }
	var b strings.Builder
	b.WriteString("WITH m AS (SELECT cur, gc FROM couchrep_kv_meta WHERE id = 1),\nok AS (SELECT ")
	var checks []string
	if has(shapeReads) || has(shapeRanges) {
		// Validation with the clears log, which is kept only back to gc.
		checks = append(checks, "$2::bigint >= (SELECT gc FROM m)")
		if has(shapeReads) {
			checks = append(checks, "NOT EXISTS (SELECT 1 FROM couchrep_kv WHERE k = ANY ($3::bytea[]) AND ver > $2::bigint)")
		}
		if has(shapeRanges) {
			checks = append(checks, `NOT EXISTS (SELECT 1 FROM unnest($4::bytea[], $5::bytea[]) AS r(b, e)
		WHERE EXISTS (SELECT 1 FROM couchrep_kv kv WHERE kv.k >= r.b AND kv.k < r.e AND kv.ver > $2::bigint))`)
		}
		var overlaps []string
		if has(shapeReads) {
			overlaps = append(overlaps, "EXISTS (SELECT 1 FROM unnest($3::bytea[]) AS x(k) WHERE x.k >= c.b AND x.k < c.e)")
		}
		if has(shapeRanges) {
			overlaps = append(overlaps, "EXISTS (SELECT 1 FROM unnest($4::bytea[], $5::bytea[]) AS r(b, e) WHERE r.b < c.e AND c.b < r.e)")
		}
		checks = append(checks, "NOT EXISTS (SELECT 1 FROM couchrep_kv_clears c WHERE c.ver > $2::bigint AND (\n\t\t"+
			strings.Join(overlaps, " OR\n\t\t")+"))")
	}
	// Keys read with their presence known need no clears log: a key that
	// had a value still has one written no later than the snapshot, and
	// one that had none still has none. (A key cleared and set again, or
	// set and cleared again, since is changed in the first case and
	// unchanged in the second, as the transaction would see it now.)
	if has(shapePresent) {
		checks = append(checks, "(SELECT count(*) FROM couchrep_kv WHERE k = ANY ($16::bytea[]) AND ver <= $2::bigint) = cardinality($16::bytea[])")
	}
	if has(shapeAbsent) {
		checks = append(checks, "NOT EXISTS (SELECT 1 FROM couchrep_kv WHERE k = ANY ($17::bytea[]))")
	}
	if len(checks) == 0 {
		checks = append(checks, "true")
	}
	b.WriteString(strings.Join(checks, "\n\tAND "))
	b.WriteString(" AS ok)")
	if has(shapeVSKeys) || has(shapeVSValues) {
		b.WriteString(",\nst AS (SELECT int8send((SELECT cur FROM m)) || int2send($1::smallint) AS s)")
	}
	if has(shapeClears) {
		b.WriteString(`,
del AS (DELETE FROM couchrep_kv WHERE k = ANY ($6::bytea[]) AND (SELECT ok FROM ok)),
clr AS (INSERT INTO couchrep_kv_clears SELECT (SELECT cur FROM m), x.k, x.k || '\x00'::bytea
	FROM unnest($6::bytea[]) AS x(k) WHERE (SELECT ok FROM ok))`)
	}
	if has(shapeVSValues) {
		b.WriteString(`,
xv AS (SELECT x.k, overlay(x.v PLACING (SELECT s FROM st) FROM x.o + 1) AS v, x.n
	FROM unnest($12::bytea[], $13::int[], $14::bytea[]) WITH ORDINALITY AS x(k, o, v, n))`)
	}
	var writes []string
	if has(shapeSets) {
		writes = append(writes, "SELECT x.k, x.v FROM unnest($7::bytea[], $8::bytea[]) AS x(k, v)")
	}
	if has(shapeVSKeys) {
		writes = append(writes, `SELECT overlay(x.k PLACING (SELECT s FROM st) FROM x.o + 1) AS k, x.v
			FROM unnest($9::bytea[], $10::int[], $11::bytea[]) AS x(k, o, v)`)
	}
	if has(shapeVSValues) {
		writes = append(writes, "SELECT xv.k, xv.v FROM xv")
	}
	if len(writes) > 0 {
		b.WriteString(",\nins AS (INSERT INTO couchrep_kv (k, v, ver)\n\tSELECT w.k, w.v, (SELECT cur FROM m) FROM (\n\t\t")
		b.WriteString(strings.Join(writes, "\n\t\tUNION ALL "))
		b.WriteString(") AS w\n\tWHERE (SELECT ok FROM ok)\n\tON CONFLICT (k) DO UPDATE SET v = excluded.v, ver = excluded.ver)")
	}
	b.WriteString("\nSELECT ok.ok, ")
	if has(shapeVSValues) {
		b.WriteString("CASE WHEN ok.ok THEN ARRAY(SELECT xv.v FROM xv ORDER BY xv.n) END")
	} else {
		b.WriteString("NULL::bytea[]")
	}
	if has(shapeNote) {
		b.WriteString(",\n\tCASE WHEN ok.ok AND $15::text IS NOT NULL THEN pg_notify('couchrep_kv', $15::text) END IS NULL")
	} else {
		b.WriteString(", true")
	}
	b.WriteString("\nFROM ok")
	return b.String()
}

// fast reports whether the transaction's commit can take fastApplySQL.
func (a *commitArgs) fast() bool { return len(a.cb) == 0 && len(a.ak) == 0 }

// size is about how many bytes encode appends.
func (a *commitArgs) size() int {
	n := 64 + 28*len(a.vo) + 28*len(a.xo)
	for _, x := range [...][][]byte{a.rk, a.rkp, a.rka, a.rb, a.re, a.cb, a.ce, a.ck, a.sk, a.sv, a.ak, a.ad, a.vk, a.vv, a.xk, a.xv} {
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
		args := [...]any{order, a.snapVersion, a.rk, a.rb, a.re, a.ck, a.sk, a.sv, a.vk, a.vo, a.vv, a.xk, a.xo, a.xv, a.note, a.rkp, a.rka}
		return encodeParams(oids, args[:], buf)
	}
	// couchrep_kv_apply validates every read key with the clears log.
	rk := slices.Concat(a.rk, a.rkp, a.rka)
	args := [...]any{order, a.snapVersion, rk, a.rb, a.re, a.cb, a.ce, a.ck, a.sk, a.sv, a.ak, a.ad,
		a.vk, a.vo, a.vv, a.xk, a.xo, a.xv, a.note}
	return encodeParams(oids, args[:], buf)
}
