package repjob_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/storetest"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/internal/share"
)

// countingDB counts the transactions run and the attempts their functions
// took: attempts beyond one are the store's retries (conflicts).
type countingDB struct {
	kv.Database
	txs, attempts atomic.Int64
}

func (c *countingDB) Transact(ctx context.Context, fn func(kv.Tx) error) error {
	c.txs.Add(1)
	return c.Database.Transact(ctx, func(tx kv.Tx) error {
		c.attempts.Add(1)
		return fn(tx)
	})
}

func (c *countingDB) retries() int64 { return c.attempts.Load() - c.txs.Load() }

// TestConcurrentJobEndsChargeWithoutConflicts: many jobs of one
// _replicator database crashing at once (each crash charges its run to
// the database's fair-share account and enqueues the job again) commit
// without a single retry — the account is charged with atomic adds, not a
// read and a write of one hot key — and the account ends where the same
// crashes one after another leave it.
func TestConcurrentJobEndsChargeWithoutConflicts(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		const n = 40
		db := &countingDB{Database: storetest.Open(t)}
		clock := schedpolicy.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
		q := jobqueue.New(db, jobqueue.Options{Clock: clock.Now, NodeName: "n1", AcceptSpread: 1})
		p := schedpolicy.DefaultPolicy()
		store := repjob.New(q, db, repjob.Options{Clock: clock, ServerUUID: uuid, Policy: p})
		const key = "users/_replicator"
		runs := make([]*repjob.Run, 0, n)
		for i := range n {
			if _, err := store.AddPersistent(ctx, repjob.PersistentDoc{Server: "http://c", DB: key, DocID: fmt.Sprint("d", i),
				Body: body(fmt.Sprintf("http://a/u%d", i), "http://b/central", `,"continuous":true`)}); err != nil {
				t.Fatal(err)
			}
		}
		for range n {
			run, err := store.Accept(ctx, false)
			if err != nil {
				t.Fatal(err)
			}
			if err := run.Start(ctx, "n1"); err != nil {
				t.Fatal(err)
			}
			runs = append(runs, run)
		}
		before, err := store.ShareAccount(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		// Every job reserved a quantum when it was added, and the
		// frontier rose to the last one's deadline as they were
		// accepted: the account is n quanta in, counted once.
		if want := uint64(n * share.Params{Quantum: p.RunQuantum()}.ReserveCost(share.DefaultShares)); before.Finish != want {
			t.Fatalf("account after %d jobs added and accepted: %d, want %d", n, before.Finish, want)
		}

		ran := 10 * time.Second
		clock.Advance(ran)
		txs, retries := db.txs.Load(), db.retries()
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, n)
		for _, run := range runs {
			wg.Go(func() {
				<-start
				if _, err := run.Crash(ctx, "could not open source"); err != nil {
					errs <- err
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		// PostgreSQL retries conflicts only: none (a read and write of
		// the account retried 366-407 times here). The embedded store
		// also runs an attempt again when a transaction's reads through
		// its warm writer connection cannot go on in one state (another
		// commit wrote a key it had read, the account's counter among
		// them: sqlite/read.go), without a conflict; how often depends on
		// how the commits interleave (3-10 on a quiet machine, 17 at a
		// load of 23), but the attempt after such a one reads from a
		// reader's snapshot and can only fail on a conflict: at most one
		// retry a transaction. PostgreSQL is the backend that tells a
		// conflict-free charge from a hot key.
		allowed := int64(0)
		if strings.HasSuffix(t.Name(), "/sqlite") {
			allowed = n
		}
		if got := db.retries() - retries; got > allowed {
			t.Errorf("%d concurrent crashes of one database's jobs: %d transactions, %d retries, want at most %d",
				n, db.txs.Load()-txs, got, allowed)
		}
		// Each crash: the run beyond its reserved quantum (a refund of the
		// unused part) and a new quantum reserved.
		qc := share.Params{Quantum: p.RunQuantum()}.ReserveCost(share.DefaultShares)
		want := int64(before.Finish) + n*(qc-share.Cost(p.RunQuantum()-ran, share.DefaultShares))
		after, err := store.ShareAccount(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if int64(after.Finish) != want {
			t.Errorf("account after %d crashes: %d, want %d", n, after.Finish, want)
		}
	})
}

// TestLaggingAccountBanksAtMostOneQuantum: the account charged with atomic
// adds is floored at the frontier only when an enqueue folds it; a key
// whose summed account fell more than one quantum behind the frontier (its
// one job crashed at once, its unused quantum refunded, while another
// key's ten jobs moved the frontier ten quanta on) is folded at its next
// enqueue, so that the credit it keeps is at most one quantum of its own:
// its job's new deadline is a quantum past the frontier, not behind it.
func TestLaggingAccountBanksAtMostOneQuantum(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		e := newEnv(t, nil)
		add := func(db string, i int) {
			t.Helper()
			if _, err := e.store.AddPersistent(ctx, repjob.PersistentDoc{Server: "http://c", DB: db, DocID: fmt.Sprint("d", i),
				Body: body(fmt.Sprintf("http://a/%s%d", db[:1], i), "http://b/central", `,"continuous":true`)}); err != nil {
				t.Fatal(err)
			}
		}
		add("x/_replicator", 0)
		for i := range 10 {
			add("y/_replicator", i)
		}
		var x *repjob.Run
		for range 11 {
			run, err := e.store.Accept(ctx, false)
			if err != nil {
				t.Fatal(err)
			}
			if err := run.Start(ctx, "n1"); err != nil {
				t.Fatal(err)
			}
			if run.Record().GetShareKey() == "x/_replicator" {
				x = run
			}
		}
		ahead, qc, err := e.store.ShareLag(ctx, "x/_replicator")
		if err != nil {
			t.Fatal(err)
		}
		if ahead > -8*qc {
			t.Fatalf("x before its crash: %d ahead of the frontier, want about 9 quanta (%d) behind", ahead, 9*qc)
		}
		if _, err := x.Crash(ctx, "could not open source"); err != nil {
			t.Fatal(err)
		}
		ahead, _, err = e.store.ShareLag(ctx, "x/_replicator")
		if err != nil {
			t.Fatal(err)
		}
		// Folded at the frontier, then one quantum reserved.
		if ahead != qc {
			t.Fatalf("x after its crash: %d ahead of the frontier, want one quantum (%d)", ahead, qc)
		}
	})
}

// conflictingDB is a store that, once armed, makes the next transaction's
// first attempt lose a conflict: after the attempt's function ran, another
// transaction rewrites the first key the attempt read with a conflict.
type conflictingDB struct {
	kv.Database
	armed    atomic.Bool
	injected atomic.Int64
}

// readConflicts records the first key its transaction read with a
// conflict.
type readConflicts struct {
	kv.Tx
	first []byte
}

func (r *readConflicts) Get(key []byte) ([]byte, error) {
	if r.first == nil {
		r.first = append([]byte(nil), key...)
	}
	return r.Tx.Get(key)
}

func (r *readConflicts) AddReadConflictKey(key []byte) {
	if r.first == nil {
		r.first = append([]byte(nil), key...)
	}
	r.Tx.AddReadConflictKey(key)
}

func (c *conflictingDB) Transact(ctx context.Context, fn func(kv.Tx) error) error {
	return c.Database.Transact(ctx, func(tx kv.Tx) error {
		if !c.armed.Load() {
			return fn(tx)
		}
		r := &readConflicts{Tx: tx}
		if err := fn(r); err != nil || r.first == nil || !c.armed.CompareAndSwap(true, false) {
			return err
		}
		c.injected.Add(1)
		return c.Database.Transact(ctx, func(tx kv.Tx) error {
			v, err := tx.Get(r.first)
			if err == nil && v != nil {
				tx.Set(r.first, v)
			}
			return err
		})
	})
}

// TestCrashStormSharesSurviveAcceptConflicts is BenchmarkCrashStorm on a
// fake clock, one step at a time, deterministic (AcceptSpread 1): three
// _replicator databases with shares 1:2:4, 26 jobs each, 7 slots; every
// step the 7 running jobs run for one quantum (20 ms), crash (backoff
// 1 ms) and the slots are filled again, lowest deadline first. A crashed
// job competes again once an accept promotes it back to READY, every
// promoteEvery (100 ms, five steps). In every fifth promotion interval
// the accept that promotes loses a conflict, as 63 of 296 did on
// PostgreSQL in the storm. The runs must split 1:2:4 within 5 %.
//
// Before the retry promoted again (jobqueue), c's crashed jobs stayed out
// of the queue for another 100 ms, c's jobs still READY ran out, a's and
// b's jobs took c's slots, a's six next ones at once, whose deadlines are
// four of c's quanta apart: the frontier leapt 20 of c's quanta past c's
// account, c's next enqueue folded the account up to it and c lost those
// quanta for good, every time: a 15.9 %, b 31.8 %, c 52.3 % of the runs
// (11 % off), on both backends — BenchmarkCrashStorm's PostgreSQL skew.
func TestCrashStormSharesSurviveAcceptConflicts(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		keys := []string{"a/_replicator", "b/_replicator", "c/_replicator"}
		weights := map[string]int{"a/_replicator": 100, "b/_replicator": 200, "c/_replicator": 400}
		// Each step runs 7 jobs for 20 ms (one quantum) and advances the
		// clock 21 ms: an accept promotes every fifth step. c's 22 jobs
		// not running cover its 4 slots for those five steps, not for
		// ten.
		const perKey, slots, steps, warmUp, runFor = 26, 7, 200, 40, 20 * time.Millisecond
		const every = 25 // steps: every fifth promotion loses a conflict
		db := &conflictingDB{Database: storetest.Open(t)}
		clock := schedpolicy.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
		q := jobqueue.New(db, jobqueue.Options{Clock: clock.Now, NodeName: "n1", AcceptSpread: 1})
		p := schedpolicy.DefaultPolicy()
		p.MinBackoff, p.MaxBackoff, p.MaxJobs = time.Millisecond, time.Millisecond, slots
		p.Interval, p.MaxChurn = runFor, slots // a quantum of one run
		store := repjob.New(q, db, repjob.Options{Clock: clock, ServerUUID: uuid, Policy: p, Shares: weights})
		for i := range perKey {
			for _, k := range keys {
				if _, err := store.AddPersistent(ctx, repjob.PersistentDoc{Server: "http://c", DB: k, DocID: fmt.Sprint("d", i),
					Body: body(fmt.Sprintf("http://a/%s-%d", k[:1], i), "http://b/central", `,"continuous":true`)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		runs := map[string]int{}
		armed := 0
		for r := range steps {
			running := make([]*repjob.Run, 0, slots)
			for i := range slots {
				if i == 0 && r%every == 0 && r > 0 {
					db.armed.Store(true)
					armed++
				}
				run, err := store.Accept(ctx, false)
				db.armed.Store(false)
				if err != nil {
					t.Fatalf("step %d, slot %d: %v", r, i, err)
				}
				if err := run.Start(ctx, "n1"); err != nil {
					t.Fatal(err)
				}
				running = append(running, run)
				if r >= warmUp {
					runs[run.Record().GetShareKey()]++
				}
			}
			clock.Advance(runFor)
			for _, run := range running {
				if _, err := run.Crash(ctx, "could not open source"); err != nil {
					t.Fatal(err)
				}
			}
			clock.Advance(time.Millisecond)
		}
		if got := db.injected.Load(); got != int64(armed) {
			t.Fatalf("%d conflicts injected, want %d", got, armed)
		}
		total := (steps - warmUp) * slots
		worst := 0.0
		var split []string
		for _, k := range keys {
			want := float64(weights[k]) / 700
			got := float64(runs[k]) / float64(total)
			worst = max(worst, math.Abs(got/want-1))
			split = append(split, fmt.Sprintf("%s %.1f%% (weight %.1f%%)", k[:1], 100*got, 100*want))
		}
		if worst > 0.05 {
			t.Errorf("runs after the warm-up: %v: off by up to %.1f%%, want within 5%%", split, 100*worst)
		} else {
			t.Logf("runs after the warm-up: %v: off by up to %.1f%%", split, 100*worst)
		}
	})
}
