package jobqueue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/postgres"
	"github.com/couchrep/couchrep/internal/kv/postgres/pgtest"
	"github.com/couchrep/couchrep/messages"
)

// BenchmarkFailover is the store's side of a node's failover on
// PostgreSQL: a dead node's lease holding N jobs (10,000;
// COUCHREP_FAILOVER_BENCH_JOBS) is expired by the activity monitor (its
// jobs back in the queue), then two survivors accept them all. "expire"
// is the monitor's expiry as it is (records and job-lease entries of a
// batch in one round trip, kv.GetMany), "expire-one-by-one" the same loop
// reading them one after the other (as before); "accept" one Accept per
// transaction on each survivor, "accept-many" AcceptMany batches of 64.
//
//	go test -run '^$' -bench Failover -benchtime 1x ./internal/jobqueue/
func BenchmarkFailover(b *testing.B) {
	n := 10_000
	if v, err := strconv.Atoi(os.Getenv("COUCHREP_FAILOVER_BENCH_JOBS")); err == nil && v > 0 {
		n = v
	}
	srv := pgtest.Start(b)
	for _, expire := range []string{"expire", "expire-one-by-one"} {
		for _, accept := range []string{"accept", "accept-many"} {
			b.Run(expire+"/"+accept, func(b *testing.B) {
				for range b.N {
					benchFailover(b, srv.NewDatabase(b), n, expire == "expire-one-by-one", accept == "accept-many")
				}
			})
		}
	}
}

func benchFailover(b *testing.B, dsn string, n int, oneByOne, many bool) {
	ctx := context.Background()
	open := func() kv.Database {
		db, err := postgres.Open(ctx, dsn, postgres.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = db.Close() })
		return db
	}
	dead := New(open(), Options{NodeName: "dead"})
	if err := dead.SetTypeTimeout(ctx, benchType, time.Minute); err != nil {
		b.Fatal(err)
	}
	for from := 0; from < n; from += 500 {
		if err := dead.db.Transact(ctx, func(tx kv.Tx) error {
			for i := from; i < min(n, from+500); i++ {
				if err := dead.AddTx(tx, benchType, fmt.Sprintf("job-%06d", i), AddOptions{Priority: uint64(i)}); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	l, err := dead.OpenLease(ctx, benchType)
	if err != nil {
		b.Fatal(err)
	}
	for taken := 0; taken < n; {
		jobs, err := dead.AcceptMany(ctx, benchType, 256, AcceptOptions{Lease: l})
		if err != nil {
			b.Fatal(err)
		}
		taken += len(jobs)
	}
	survivors := []*Queue{New(open(), Options{NodeName: "s1"}), New(open(), Options{NodeName: "s2"})}
	m := survivors[0].NewMonitor(MonitorOptions{})
	var through [kv.VersionstampLength]byte
	for i := range through {
		through[i] = 0xff
	}

	b.ResetTimer()
	t0 := time.Now()
	expired := 0
	if oneByOne {
		expired, err = m.expireLeasesOneByOne(ctx, benchType, through)
	} else {
		expired, err = m.expireLeases(ctx, benchType, through)
	}
	if err != nil || expired != n {
		b.Fatalf("expired %d of %d: %v", expired, n, err)
	}
	tExpire := time.Since(t0)
	t1 := time.Now()
	done := make(chan int, len(survivors))
	for _, q := range survivors {
		go func() {
			got := 0
			defer func() { done <- got }()
			sl, err := q.OpenLease(ctx, benchType)
			if err != nil {
				b.Error(err)
				return
			}
			for {
				var k int
				if many {
					jobs, err := q.AcceptMany(ctx, benchType, 64, AcceptOptions{Lease: sl})
					if errors.Is(err, ErrNotFound) {
						return
					}
					if err != nil {
						b.Error(err)
						return
					}
					k = len(jobs)
				} else {
					if _, err := q.Accept(ctx, benchType, AcceptOptions{Lease: sl}); errors.Is(err, ErrNotFound) {
						return
					} else if err != nil {
						b.Error(err)
						return
					}
					k = 1
				}
				got += k
			}
		}()
	}
	accepted := 0
	for range survivors {
		accepted += <-done
	}
	tAccept := time.Since(t1)
	b.StopTimer()
	if accepted != n {
		b.Fatalf("the survivors accepted %d of %d", accepted, n)
	}
	b.ReportMetric(tExpire.Seconds(), "s-expire")
	b.ReportMetric(tAccept.Seconds(), "s-accept")
	b.ReportMetric(float64(n)/tAccept.Seconds(), "accepts/s")
}

// expireLeasesOneByOne is expireLeases as it was before kv.GetMany: each
// member's record and job-lease entry read one after the other.
func (m *Monitor) expireLeasesOneByOne(ctx context.Context, typ string, through [kv.VersionstampLength]byte) (int, error) {
	q := m.q
	var stale [][]byte
	if err := q.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		begin, end := q.keys.leaseActivityRangeThrough(typ, through)
		var err error
		stale, err = kv.Keys(tx.Snapshot().GetRange(begin, end, kv.RangeOptions{Limit: m.opts.BatchSize}))
		return err
	}); err != nil {
		return 0, err
	}
	total := 0
	for _, key := range stale {
		_, lease, err := q.keys.parseLeaseActivity(key)
		if err != nil {
			return total, err
		}
		for done := false; !done; {
			n := 0
			err := q.db.Transact(ctx, func(tx kv.Tx) error {
				n, done = 0, false
				begin, end := q.keys.leaseJobsRange(typ, lease)
				it := tx.GetRange(begin, end, kv.RangeOptions{Limit: m.opts.BatchSize})
				var members []kv.KeyValue
				for it.Next() {
					e := it.KeyValue()
					members = append(members, kv.KeyValue{Key: bytes.Clone(e.Key), Value: bytes.Clone(e.Value)})
				}
				if err := it.Err(); err != nil {
					return err
				}
				now := q.clock()
				for _, mem := range members {
					id, _ := lastTupleString(q.keys.root.Sub(tagLeaseJobs), mem.Key)
					rec, err := q.loadRecord(tx, typ, id)
					if err != nil {
						return err
					}
					if err := q.releaseLease(tx, typ, id); err != nil {
						return err
					}
					tx.Clear(mem.Key)
					if rec == nil || rec.GetState() != messages.JobState_JOB_STATE_RUNNING || !bytes.Equal(rec.GetWorkerLock(), mem.Value) {
						continue
					}
					q.clearActivity(tx, rec)
					if err := q.requeueRecord(tx, rec, now); err != nil {
						return err
					}
					n++
				}
				if len(members) < m.opts.BatchSize {
					tx.Clear(q.keys.leaseKey(typ, lease))
					tx.Clear(key)
					done = true
				}
				return nil
			})
			if err != nil {
				return total, err
			}
			total += n
		}
	}
	return total, nil
}
