package sqlite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/kvtest"
	"github.com/couchrep/couchrep/internal/kv/tuple"
)

func benchDB(b *testing.B, d kv.Durability) *DB {
	db, err := Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"), Options{Durability: d})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return db
}

var durabilities = []struct {
	name string
	d    kv.Durability
}{{"normal", kv.DurabilityNormal}, {"full", kv.DurabilityFull}}

// parallel runs b.N operations spread over g goroutines and reports op/s.
func parallel(b *testing.B, g int, op func(worker, i int) error) {
	var wg sync.WaitGroup
	errs := make(chan error, g)
	start := time.Now()
	cpu0 := processCPU()
	for w := range g {
		wg.Go(func() {
			for i := w; i < b.N; i += g {
				if err := op(w, i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tx/s")
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// BenchmarkRMW: one read-modify-write transaction of a single key, each
// goroutine on its own key ("own") or all on one key ("shared", conflicts).
func BenchmarkRMW(b *testing.B) {
	for _, dur := range durabilities {
		for _, g := range []int{1, 8} {
			for _, shared := range []bool{false, true} {
				if g == 1 && shared {
					continue
				}
				name := fmt.Sprintf("%s/g=%d/own", dur.name, g)
				if shared {
					name = fmt.Sprintf("%s/g=%d/shared", dur.name, g)
				}
				b.Run(name, func(b *testing.B) {
					db := benchDB(b, dur.d)
					ctx := context.Background()
					b.ResetTimer()
					parallel(b, g, func(w, _ int) error {
						key := tuple.Tuple{"n", w}.Pack()
						if shared {
							key = tuple.Tuple{"n"}.Pack()
						}
						return db.Transact(ctx, func(tx kv.Tx) error {
							v, err := tx.Get(key)
							if err != nil {
								return err
							}
							tx.Set(key, kv.EncodeInt64LE(kv.Int64LE(v)+1))
							return nil
						})
					})
				})
			}
		}
	}
}

// BenchmarkRangeScan100k: a full scan of 100,000 keys in one read
// transaction; one op is one scan.
func BenchmarkRangeScan100k(b *testing.B) {
	db := benchDB(b, kv.DurabilityNormal)
	ctx := context.Background()
	s := tuple.NewSubspace(nil, tuple.Tuple{"scan"})
	const n = 100000
	for start := 0; start < n; start += 10000 {
		if err := db.Transact(ctx, func(tx kv.Tx) error {
			for i := start; i < start+10000; i++ {
				tx.Set(s.Pack(tuple.Tuple{int64(i)}), []byte("value-of-some-length"))
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	begin, end := s.Range()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		count := 0
		if err := db.ReadTransact(ctx, func(tx kv.ReadTx) error {
			it := tx.GetRange(begin, end, kv.RangeOptions{})
			for it.Next() {
				count++
			}
			return it.Err()
		}); err != nil || count != n {
			b.Fatalf("scan: %d keys, %v", count, err)
		}
	}
	b.ReportMetric(float64(b.N*n)/time.Since(start).Seconds(), "keys/s")
}

// BenchmarkQueueCycle approximates a couch_jobs accept+update+finish cycle
// (three transactions) with 8 workers over a pre-filled pending queue:
// accept snapshot-reads up to 32 pending keys, picks one at random and adds
// a read conflict on it, as couch_jobs does.
func BenchmarkQueueCycle(b *testing.B) {
	for _, dur := range durabilities {
		b.Run(dur.name+"/w=8", func(b *testing.B) {
			db := benchDB(b, dur.d)
			ctx := context.Background()
			pending := tuple.NewSubspace(nil, tuple.Tuple{"pending"})
			jobs := tuple.NewSubspace(nil, tuple.Tuple{"job"})
			for start := 0; start < b.N; start += 5000 {
				if err := db.Transact(ctx, func(tx kv.Tx) error {
					for i := start; i < min(start+5000, b.N); i++ {
						tx.Set(pending.Pack(tuple.Tuple{int64(i)}), nil)
						tx.Set(jobs.Pack(tuple.Tuple{int64(i)}), []byte("pending"))
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			// parallel reports ops/s as "tx/s"; here one op is one 3-tx cycle.
			parallel(b, 8, func(w, _ int) error {
				var id int64 = -1
				err := db.Transact(ctx, func(tx kv.Tx) error {
					id = -1
					begin, end := pending.Range()
					var keys [][]byte
					it := tx.Snapshot().GetRange(begin, end, kv.RangeOptions{Limit: 32})
					for it.Next() {
						keys = append(keys, it.KeyValue().Key)
					}
					if err := it.Err(); err != nil || len(keys) == 0 {
						return err
					}
					k := keys[rand.IntN(len(keys))]
					tx.AddReadConflictKey(k)
					tx.Clear(k)
					t, err := pending.Unpack(k)
					if err != nil {
						return err
					}
					id = t[0].(int64)
					tx.Set(jobs.Pack(tuple.Tuple{id}), []byte("running"))
					return nil
				})
				if err != nil || id < 0 {
					return err
				}
				for _, state := range []string{"running, updated", "finished"} {
					if err := db.Transact(ctx, func(tx kv.Tx) error {
						if _, err := tx.Get(jobs.Pack(tuple.Tuple{id})); err != nil {
							return err
						}
						tx.Set(jobs.Pack(tuple.Tuple{id}), []byte(state))
						return nil
					}); err != nil {
						return err
					}
				}
				return nil
			})
			// Attempts whose reads through the writer connection had to
			// start over on a reader snapshot (read.go), per cycle.
			b.ReportMetric(float64(db.moves.Load())/float64(b.N), "moved/cycle")
			b.ReportMetric(float64(db.batched.Load())/float64(max(1, db.batches.Load())), "tx/batch")
		})
	}
}

// BenchmarkTwoProcesses: two processes add to their own counters on one
// file until b.N commits are done; reports the aggregate rate and the
// smaller process's share.
func BenchmarkTwoProcesses(b *testing.B) {
	path := filepath.Join(b.TempDir(), "store.db")
	total := max(b.N, 2000)
	start := time.Now()
	a := kvtest.StartChild(b, "fair", path, envTotal+"="+strconv.Itoa(total))
	c := kvtest.StartChild(b, "fair", path, envTotal+"="+strconv.Itoa(total))
	a.Wait(b)
	c.Wait(b)
	elapsed := time.Since(start)
	db, err := Open(context.Background(), path, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	var counts []int64
	for _, ch := range []*kvtest.Child{a, c} {
		var n int64
		if err := db.ReadTransact(context.Background(), func(tx kv.ReadTx) error {
			v, err := tx.Get(space.Pack(tuple.Tuple{"count", int64(ch.Cmd.Process.Pid)}))
			n = kv.Int64LE(v)
			return err
		}); err != nil {
			b.Fatal(err)
		}
		counts = append(counts, n)
	}
	b.ReportMetric(float64(total)/elapsed.Seconds(), "commits/s")
	b.ReportMetric(100*float64(min(counts[0], counts[1]))/float64(total), "min-share-%")
}

// processCPU returns the user+system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIdleWatches measures the CPU a process spends holding 1,000
// armed watches on keys nobody writes for 3 s (the watch poll of an idle
// node): cpu-ms/s is user+system CPU time per wall second.
func BenchmarkIdleWatches(b *testing.B) {
	db, _ := openTemp(b, Options{})
	ctx := context.Background()
	for range b.N {
		ws := make([]kv.Watch, 0, 1000)
		if err := db.Transact(ctx, func(tx kv.Tx) error {
			ws = ws[:0]
			for i := range 1000 {
				ws = append(ws, tx.Watch([]byte(fmt.Sprintf("idle/%04d", i))))
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		before := processCPU()
		start := time.Now()
		time.Sleep(3 * time.Second)
		used, wall := processCPU()-before, time.Since(start)
		for _, w := range ws {
			w.Cancel()
		}
		b.ReportMetric(float64(used.Milliseconds())/wall.Seconds(), "cpu-ms/s")
	}
}
