package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/postgres/pgtest"
)

// saturate holds every connection of db's main pool in a transaction
// that has read (a snapshot is open) and waits, with more transactions
// queued for a connection behind them, until the returned function is
// called; it returns once the pool is full.
func saturate(t *testing.T, db *DB, queued int) (release func()) {
	t.Helper()
	hold := make(chan struct{})
	var wg sync.WaitGroup
	n := int(db.pool.Config().MaxConns)
	holding := make(chan struct{}, n+queued)
	for i := range n + queued {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			_ = db.Transact(context.Background(), func(tx kv.Tx) error {
				// A range read opens the transaction's snapshot on a
				// pooled connection (a lone point read would not).
				it := tx.GetRange([]byte("job/"), []byte("job0"), kv.RangeOptions{Limit: 1})
				for it.Next() {
				}
				if err := it.Err(); err != nil {
					return err
				}
				if first {
					first = false
					holding <- struct{}{}
				}
				<-hold
				tx.Set(fmt.Appendf(nil, "job/%d", i), []byte("x"))
				return nil
			})
		}()
	}
	for range n {
		<-holding
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			close(hold)
			wg.Wait()
		})
	}
	t.Cleanup(release)
	return release
}

// TestLivenessLane: with every connection of the main pool held by job
// transactions and more queued behind them, the transactions marked
// kv.WithPriority (heartbeats, lease renewals) still read and commit, and
// the health check still answers, through the lane; an unmarked
// transaction that needs a pooled connection waits for one.
func TestLivenessLane(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	dsn := pgtest.Shared(t).NewDatabase(t)
	db := openDB(t, dsn, Options{MaxConns: 4})
	ctx := context.Background()
	if err := db.Transact(ctx, func(tx kv.Tx) error {
		tx.Set([]byte("node/a"), []byte("0"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The commit and read connections are open (they are taken from the
	// lane, as they would be while the pool is busy).
	if err := db.ReadTransact(ctx, func(tx kv.ReadTx) error { _, err := tx.Get([]byte("node/a")); return err }); err != nil {
		t.Fatal(err)
	}
	release := saturate(t, db, 50)

	// The control: a transaction outside the lane that needs a pooled
	// connection gets none while the pool is held.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := db.ReadTransact(short, func(tx kv.ReadTx) error {
		_, err := kv.Keys(tx.GetRange([]byte("node/"), []byte("node0"), kv.RangeOptions{}))
		return err
	})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a transaction outside the lane while the pool is held: %v, want it to wait for a connection", err)
	}

	// The lane: a heartbeat's read-modify-write (two reads: a snapshot),
	// a read of the members, the health check, many times over, while
	// the pool stays held.
	lane, cancel := context.WithTimeout(kv.WithPriority(ctx), time.Minute)
	defer cancel()
	for round := range 20 {
		if err := db.Check(lane); err != nil {
			t.Fatalf("round %d: health check: %v", round, err)
		}
		if err := db.Transact(lane, func(tx kv.Tx) error {
			if _, err := tx.Get([]byte("owner/a")); err != nil {
				return err
			}
			if _, err := tx.Get([]byte("node/a")); err != nil {
				return err
			}
			tx.Set([]byte("node/a"), fmt.Appendf(nil, "%d", round+1))
			return nil
		}); err != nil {
			t.Fatalf("round %d: heartbeat: %v", round, err)
		}
		var got []byte
		if err := db.ReadTransact(lane, func(tx kv.ReadTx) error {
			it := tx.GetRange([]byte("node/"), []byte("node0"), kv.RangeOptions{})
			for it.Next() {
				got = append([]byte(nil), it.KeyValue().Value...)
			}
			return it.Err()
		}); err != nil {
			t.Fatalf("round %d: members: %v", round, err)
		}
		if want := fmt.Sprint(round + 1); string(got) != want {
			t.Fatalf("round %d: read back %q, want %q", round, got, want)
		}
	}
	// Every job transaction is still waiting or holding: nothing of the
	// above went through the main pool.
	if st := db.pool.Stat(); st.AcquiredConns() != st.MaxConns() {
		t.Fatalf("main pool: %d of %d connections acquired, want all held by the job transactions", st.AcquiredConns(), st.MaxConns())
	}
	release()
	// And the job transactions all commit once they may.
	var n int
	if err := db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		keys, err := kv.Keys(tx.GetRange([]byte("job/"), []byte("job0"), kv.RangeOptions{}))
		n = len(keys)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if n != 4+50 {
		t.Fatalf("%d job transactions committed, want %d", n, 4+50)
	}
}

// TestBatcherFront: requests of the liveness lane go ahead of the queued
// ones, in their own order, and into the next batch.
func TestBatcherFront(t *testing.T) {
	var b batcher[int]
	for i := range 300 {
		b.add(i)
	}
	b.addFront(-1)
	b.addFront(-2)
	first := b.take(2, 1)
	if len(first) != maxBatch || first[0] != -1 || first[1] != -2 || first[2] != 0 {
		t.Fatalf("first batch starts %v, want [-1 -2 0 ...] of %d", first[:3], maxBatch)
	}
	b.addFront(-3)
	second := b.take(2, 1)
	if second[0] != -3 || second[1] != maxBatch-2 {
		t.Fatalf("second batch starts %v, want [-3 %d ...]", second[:2], maxBatch-2)
	}
}

// TestAcquireTakesParked: a transaction waiting for a connection of a
// full pool takes one that another transaction parks meanwhile (its
// snapshot to be ended by the next user), rather than sleep in the pool's
// queue until the sweep releases the parked one a second later: with the
// pool full, every connection ended parked and a busy node ran 16
// transactions a second.
func TestAcquireTakesParked(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	dsn := pgtest.Shared(t).NewDatabase(t)
	db := openDB(t, dsn, Options{MaxConns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _, err := db.acquire(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, beginSQL); err != nil { // a snapshot, as a transaction's
		t.Fatal(err)
	}
	type result struct {
		dirty bool
		err   error
	}
	waited := make(chan result, 1)
	go func() {
		c2, dirty, err := db.acquire(ctx, false)
		if err == nil {
			db.park(c2)
		}
		waited <- result{dirty, err}
	}()
	// The waiter is in the pool's queue (the pool's one connection is
	// held): wait until pgxpool counts it as waiting.
	for db.pool.Stat().EmptyAcquireCount() == 0 {
		if ctx.Err() != nil {
			t.Fatal("the second acquire never waited for the pool")
		}
		time.Sleep(time.Millisecond) // pgxpool's own counter: poll
	}
	db.park(c)
	r := <-waited
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !r.dirty {
		t.Fatal("the waiting acquire got a connection from the pool, not the parked one (it waited for the sweep)")
	}
}
