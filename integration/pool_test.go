package integration

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors/connpool"
	"github.com/couchrep/couchrep/actors/ratelimiter"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/testserver"
	"github.com/couchrep/couchrep/supervisor"
)

// intervalLog wraps the node's rate limiter and records, per key, the
// interval after every 429 and every success the replication reported.
type intervalLog struct {
	*ratelimiter.Limiter
	mu     sync.Mutex
	series map[couch.LimitKey][]time.Duration
}

func (l *intervalLog) record(k couch.LimitKey) {
	i := l.Interval(k)
	l.mu.Lock()
	l.series[k] = append(l.series[k], i)
	l.mu.Unlock()
}

func (l *intervalLog) Failure(k couch.LimitKey) { l.Limiter.Failure(k); l.record(k) }
func (l *intervalLog) Success(k couch.LimitKey) { l.Limiter.Success(k); l.record(k) }

// risesAndFalls reports the highest interval and whether it ever went down
// after going up.
func risesAndFalls(s []time.Duration) (peak time.Duration, fell bool) {
	for i, d := range s {
		peak = max(peak, d)
		if i > 0 && d < s[i-1] {
			fell = true
		}
	}
	return peak, fell
}

// TestReplicationThroughPoolAndLimiterActors runs a replication the way a
// node's job does — HTTP through a connection_pool lease, pacing through the
// rate_limiter actor's table — with both endpoints behind a proxy that
// answers every other request with 429. The replication completes (a 429
// does not use up a retry), every document arrives, the interval rises on
// 429s and falls on successes, and the lease never exceeds
// http_connections requests per endpoint.
func TestReplicationThroughPoolAndLimiterActors(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server")
	}
	s := testserver.StartPouchDB(t)
	src := s.CreateDB(t, "pool-src")
	const n = 400
	var docs []map[string]any
	for i := range n {
		docs = append(docs, testserver.Doc(fmt.Sprintf("d%03d", i), []string{"1-a"}, map[string]any{"i": i}))
	}
	s.PutRevs(t, src, docs...)
	s.CreateDB(t, "pool-tgt")
	proxy := newProxy(t, s.URL)
	proxy.tooMany.Store(true)

	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sup, err := supervisor.Start(ctx, system, "pool_sup", supervisor.Spec{
		Strategy: supervisor.RestForOne, MaxRestarts: 10, Period: time.Second,
		Children: []supervisor.ChildSpec{
			{Name: connpool.Name, Props: connpool.Props(connpool.Config{Logger: zerolog.Nop()})},
			{Name: ratelimiter.Name, Props: ratelimiter.Props(ratelimiter.Config{Logger: zerolog.Nop()})},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sup.Stop(context.Background()) }()
	pool := connpool.At(system, actor.NewPID(system.Address(), "pool_sup/"+connpool.Name))
	limiter := ratelimiter.At(system, actor.NewPID(system.Address(), "pool_sup/"+ratelimiter.Name))

	job, err := system.Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), "job")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = system.Root.StopFuture(job).Wait() }()
	const httpConnections = 3
	lease, err := pool.Acquire(ctx, job, httpConnections)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release()

	rec := &intervalLog{Limiter: limiter, series: map[couch.LimitKey][]time.Duration{}}
	p := params(t, map[string]any{"source": proxy.URL + "/pool-src/", "target": proxy.URL + "/pool-tgt/",
		"worker_batch_size": 20, "http_connections": httpConnections, "retries_per_request": 2})
	res, err := replicate.New(p, replicate.Options{ServerUUID: "test-uuid", Logger: zerolog.Nop(),
		HTTPClient: lease.Client(), Limiter: rec}).Run(ctx)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Stats.DocsWritten != n {
		t.Errorf("docs_written = %d, want %d", res.Stats.DocsWritten, n)
	}
	verify(t, s, s, src, s.DBURL("pool-tgt"), nil)

	rec.mu.Lock()
	var rose, fell bool
	for k, series := range rec.series {
		peak, down := risesAndFalls(series)
		t.Logf("%s %s: %d updates, peak %v, last %v", k.Method, k.Endpoint, len(series), peak, series[len(series)-1])
		rose = rose || peak >= 24*time.Millisecond
		fell = fell || (peak > 0 && down)
	}
	rec.mu.Unlock()
	if !rose || !fell {
		t.Errorf("interval rose %v, fell %v; want both", rose, fell)
	}
	if proxy.requests.Load() < 2*int64(n/20) {
		t.Errorf("only %d requests through the proxy", proxy.requests.Load())
	}

	st, err := pool.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Requests == 0 || st.InFlight != 0 || st.Leases != 1 {
		t.Errorf("pool stats %+v", st)
	}
	for _, u := range lease.Usage() {
		if u.Peak > httpConnections {
			t.Errorf("%s: %d concurrent requests, http_connections %d", u.Endpoint, u.Peak, httpConnections)
		}
	}
	// The node's table is the actor's: it holds the proxy's keys.
	snap, err := limiter.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rate limiter table after the run: %+v; pool: %d requests, %d waited", snap, st.Requests, st.Waited)
}
