package postgres

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/couchrep/couchrep/internal/kv/postgres/pgtest"
)

// BenchmarkFloor is what a job cycle could cost at the least through pgx
// on this machine, without this package: the cycle's three read-modify-
// write transactions (Accept, Update, Finish), each two round trips
// (BEGIN + SELECT of one row by primary key; UPDATE of that row + COMMIT),
// on a 100,000-row table, from 8 goroutines, with synchronous_commit off
// (as kv.DurabilityNormal) and on. internal/jobqueue's BenchmarkCycle on this
// backend is to be read against it (BENCHMARKS.md "PostgreSQL").
// COUCHREP_BENCH_PG names a database of a server of your own instead of a
// pgtest one (COUCHREP_BENCH_PG_PID its postmaster, for server CPU).
func BenchmarkFloor(b *testing.B) {
	dsn, pid := os.Getenv("COUCHREP_BENCH_PG"), envPID()
	if dsn == "" {
		srv := pgtest.Shared(b, "fsync = on", "full_page_writes = on")
		dsn, pid = srv.NewDatabase(b), srv.PID()
	}
	ctx := context.Background()
	const rows = 100_000
	for _, sc := range []string{"off", "on"} {
		for _, workers := range []int{1, 8} {
			b.Run(fmt.Sprintf("synchronous_commit=%s/workers=%d", sc, workers), func(b *testing.B) {
				cfg, err := pgxpool.ParseConfig(dsn)
				if err != nil {
					b.Fatal(err)
				}
				cfg.ConnConfig.RuntimeParams["synchronous_commit"] = sc
				pool, err := pgxpool.NewWithConfig(ctx, cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer pool.Close()
				if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS floor (k bigint PRIMARY KEY, v bytea NOT NULL);
					INSERT INTO floor SELECT g, '\x00' FROM generate_series(1, 100000) g ON CONFLICT DO NOTHING`); err != nil {
					b.Fatal(err)
				}
				var done atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				start, cpu0, scpu0 := time.Now(), selfCPU(), pgtest.CPU(pid)
				for range workers {
					wg.Go(func() {
						c, err := pool.Acquire(ctx)
						if err != nil {
							b.Error(err)
							return
						}
						defer c.Release()
						for done.Add(1) <= int64(b.N) {
							for range 3 { // Accept, Update, Finish
								if err := floorTx(ctx, c.Conn(), rand.Int64N(rows)+1); err != nil {
									b.Error(err)
									return
								}
							}
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
				b.ReportMetric(float64((selfCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/cycle")
				b.ReportMetric(float64((pgtest.CPU(pid)-scpu0).Microseconds())/float64(b.N), "server-cpu-µs/cycle")
			})
		}
	}
}

// floorTx reads row k and writes it back changed: two round trips.
func floorTx(ctx context.Context, c *pgx.Conn, k int64) error {
	bt := &pgx.Batch{}
	bt.Queue("BEGIN")
	bt.Queue("SELECT v FROM floor WHERE k = $1", k)
	br := c.SendBatch(ctx, bt)
	_, err := br.Exec()
	var v []byte
	if err == nil {
		err = br.QueryRow().Scan(&v)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	bt = &pgx.Batch{}
	bt.Queue("UPDATE floor SET v = $2 WHERE k = $1", k, append(v[:0:0], v[0]+1))
	bt.Queue("COMMIT")
	return c.SendBatch(ctx, bt).Close()
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func envPID() int {
	var pid int
	_, _ = fmt.Sscan(os.Getenv("COUCHREP_BENCH_PG_PID"), &pid)
	return pid
}
