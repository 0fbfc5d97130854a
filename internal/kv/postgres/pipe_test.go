package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/postgres/pgtest"
)

// holdCommitLock takes the meta row's lock (every commit's) on a
// connection of its own, until the returned function is called.
func holdCommitLock(t *testing.T, dsn string) (release func()) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "SELECT 1 FROM couchrep_kv_meta WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	released := false
	release = func() {
		if !released {
			released = true
			_, _ = c.Exec(ctx, "ROLLBACK")
			_ = c.Close(ctx)
		}
	}
	t.Cleanup(release)
	return release
}

// setKey commits k = v.
func setKey(ctx context.Context, db *DB, k, v string) error {
	return db.Transact(ctx, func(tx kv.Tx) error {
		tx.Set([]byte(k), []byte(v))
		return nil
	})
}

// waitFor polls cond until it holds (a minute at most).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after a minute", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (db *DB) inFlight() (batches, queued int) {
	return db.commitQ.state()
}

// TestCommitPipeline: a batch is written while an earlier one is still
// running (up to maxInFlight) once minPipelined commits wait for it,
// fewer wait for the batch in flight, later commits queue for the next
// batch, and all commit.
func TestCommitPipeline(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	dsn := pgtest.Shared(t).NewDatabase(t)
	db := openDB(t, dsn, Options{})
	ctx := context.Background()
	set := func(k string) error { return setKey(ctx, db, k, "v") }
	if err := set("p/warm"); err != nil { // opens the commit connection
		t.Fatal(err)
	}
	release := holdCommitLock(t, dsn)
	rt0 := db.RoundTrips()
	n := 0
	errs := make(chan error, 32)
	commit := func() {
		i := n
		n++
		go func() { errs <- set(fmt.Sprintf("p/%d", i)) }()
	}
	state := func(batches, queued int) {
		t.Helper()
		waitFor(t, fmt.Sprintf("%d batches in flight and %d commits queued", batches, queued), func() bool {
			b, q := db.inFlight()
			return b == batches && q == queued
		})
	}
	commit() // nothing in flight: sent at once
	state(1, 0)
	for range minPipelined - 1 { // too few to go while a batch is in flight
		commit()
	}
	state(1, minPipelined-1)
	commit() // enough: they go as the second batch
	state(2, 0)
	commit() // maxInFlight batches in flight: queued
	commit()
	state(2, 2)
	release()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// The two queued went together, as the third batch (fewer than
	// minPipelined: after both batches in flight came back).
	if rt := db.RoundTrips() - rt0; rt != 3 {
		t.Errorf("%d round trips for 3 batches", rt)
	}
	if err := db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		for i := range n {
			if v, err := tx.Get([]byte(fmt.Sprintf("p/%d", i))); err != nil || string(v) != "v" {
				return fmt.Errorf("p/%d = %q, %v", i, v, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestCommitConnectionLost: the commit connection ended by the server
// while idle is replaced without an error; ended while a batch runs, that
// batch's commit fails saying its outcome is unknown (it is not retried),
// and the next commit goes on a new connection.
func TestCommitConnectionLost(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	dsn := pgtest.Shared(t).NewDatabase(t)
	db := openDB(t, dsn, Options{})
	ctx := context.Background()
	set := func(k string) error { return setKey(ctx, db, k, "v") }
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	current := func() *pipe {
		return db.commits.current()
	}
	terminate := func(p *pipe) {
		t.Helper()
		if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", int32(p.pid)); err != nil {
			t.Fatal(err)
		}
	}

	if err := set("l/1"); err != nil {
		t.Fatal(err)
	}
	first := current()
	terminate(first)
	waitFor(t, "the idle commit connection seen gone", first.broken)
	if err := set("l/2"); err != nil {
		t.Fatalf("commit after the idle connection was ended: %v", err)
	}
	second := current()
	if second == first || second.pid == first.pid {
		t.Fatal("the commit did not go on a new connection")
	}

	release := holdCommitLock(t, dsn)
	errc := make(chan error, 1)
	go func() { errc <- set("l/3") }()
	waitFor(t, "a batch in flight", func() bool { b, _ := db.inFlight(); return b == 1 })
	terminate(second)
	err = <-errc
	release()
	if err == nil || !strings.Contains(err.Error(), "may or may not have happened") || !errors.Is(err, kv.ErrUnavailable) {
		t.Fatalf("commit whose connection broke mid-batch: %v; want an unknown outcome, unavailable", err)
	}
	if err := set("l/4"); err != nil {
		t.Fatalf("commit after the connection broke mid-batch: %v", err)
	}
}

// TestFastApplyVariants: the server takes every variant of the apply
// statement (the conformance suite runs the shapes that occur).
func TestFastApplyVariants(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	dsn := pgtest.Shared(t).NewDatabase(t)
	openDB(t, dsn, Options{}) // the schema
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	all, err := c.PgConn().Prepare(ctx, "", fastApplySQL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(all.ParamOIDs) != 17 {
		t.Fatalf("the full variant has %d parameters, want 17", len(all.ParamOIDs))
	}
	for shape := range shapeAll + 1 {
		sd, err := c.PgConn().Prepare(ctx, "", fastApplyFor(shape), all.ParamOIDs)
		if err != nil {
			t.Fatalf("shape %07b: %v", shape, err)
		}
		if len(sd.Fields) != 3 {
			t.Errorf("shape %07b: %d result columns, want 3", shape, len(sd.Fields))
		}
	}
}

// TestClearsLogPruned: the commit that takes a version that is a
// multiple of pruneEvery moves gc 100,000 versions behind it, and the
// clears log is pruned to gc by the DB's next batch.
func TestClearsLogPruned(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	dsn := pgtest.Shared(t).NewDatabase(t)
	db := openDB(t, dsn, Options{})
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	const next = 100 * pruneEvery // the next commit's version
	if _, err := admin.Exec(ctx, "UPDATE couchrep_kv_meta SET cur = $1", next-1); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `INSERT INTO couchrep_kv_clears
		SELECT v, '\x01'::bytea, '\x02'::bytea FROM generate_series(1, 3000) v`); err != nil {
		t.Fatal(err)
	}
	count := func() (n, min int64) {
		t.Helper()
		if err := admin.QueryRow(ctx, "SELECT count(*), coalesce(min(ver), 0) FROM couchrep_kv_clears WHERE ver <= 3000").Scan(&n, &min); err != nil {
			t.Fatal(err)
		}
		return n, min
	}
	set := func(k string) {
		t.Helper()
		if err := setKey(ctx, db, k, "v"); err != nil {
			t.Fatal(err)
		}
	}
	set("g/1") // takes version next: gc moves to next-100,000
	var gc int64
	if err := admin.QueryRow(ctx, "SELECT gc FROM couchrep_kv_meta").Scan(&gc); err != nil {
		t.Fatal(err)
	}
	if gc != next-100000 {
		t.Fatalf("gc = %d after version %d, want %d", gc, next, next-100000)
	}
	if n, _ := count(); n != 3000 {
		t.Fatalf("%d of the 3,000 old clears left before the next batch, want all", n)
	}
	set("g/2") // the DB's next batch prunes
	if n, min := count(); n != 3000-gc || min != gc+1 {
		t.Fatalf("after the pruning: %d old clears left from version %d, want %d from %d", n, min, 3000-gc, gc+1)
	}
}

// TestReadConnection: the first reads of concurrent transactions go on
// the read connection, each with its own snapshot version; ended by the
// server, it is replaced without an error.
func TestReadConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	dsn := pgtest.Shared(t).NewDatabase(t)
	writer, db := openDB(t, dsn, Options{}), openDB(t, dsn, Options{})
	ctx := context.Background()
	const n = 32
	if err := writer.Transact(ctx, func(tx kv.Tx) error {
		for i := range n {
			tx.Set([]byte(fmt.Sprintf("r/%02d", i)), []byte(fmt.Sprint(i)))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	read := func(i int) error {
		return db.Transact(ctx, func(tx kv.Tx) error {
			k := []byte(fmt.Sprintf("r/%02d", i))
			v, err := tx.Get(k)
			if err != nil {
				return err
			}
			if !isAuto(tx) || string(v) != fmt.Sprint(i) {
				return fmt.Errorf("read %s = %q (without a snapshot: %v)", k, v, isAuto(tx))
			}
			tx.Set([]byte(fmt.Sprintf("r/copy/%02d", i)), v)
			return nil
		})
	}
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- read(i) }()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	first := db.reads.current()
	if first == nil {
		t.Fatal("no read connection")
	}
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", int32(first.pid)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the read connection seen gone", first.broken)
	if err := read(0); err != nil {
		t.Fatalf("read after the read connection was ended: %v", err)
	}
	if second := db.reads.current(); second == first || second.pid == first.pid {
		t.Fatal("the read did not go on a new connection")
	}
}
