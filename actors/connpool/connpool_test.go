package connpool_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/couchrep/couchrep/actors/connpool"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/supervisor"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"))
}

// waitLimit bounds every wait: a deadlock guard, not a timing assertion.
const waitLimit = 30 * time.Second

// bundle is a running pool under a one_for_one supervisor.
type bundle struct {
	system *actor.ActorSystem
	sup    *supervisor.Supervisor
	pool   connpool.Pool
	ctx    context.Context
}

func setup(t testing.TB, cfg connpool.Config) *bundle {
	t.Helper()
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	cfg.Logger = zerolog.Nop()
	sup, err := supervisor.Start(ctx, system, "sup", supervisor.Spec{
		Strategy: supervisor.OneForOne, MaxRestarts: 10, Period: time.Minute,
		Children: []supervisor.ChildSpec{{Name: connpool.Name, Props: connpool.Props(cfg)}},
	})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = sup.Stop(context.Background()) })
	return &bundle{system: system, sup: sup, ctx: ctx,
		pool: connpool.At(system, actor.NewPID(system.Address(), "sup/"+connpool.Name))}
}

// owner spawns an actor to own leases.
func (b *bundle) owner(t testing.TB, name string) *actor.PID {
	t.Helper()
	pid, err := b.system.Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), name)
	if err != nil {
		t.Fatalf("spawn owner: %v", err)
	}
	t.Cleanup(func() { _ = b.system.Root.StopFuture(pid).Wait() })
	return pid
}

func (b *bundle) acquire(t testing.TB, owner *actor.PID, max int) *connpool.Lease {
	t.Helper()
	l, err := b.pool.Acquire(b.ctx, owner, max)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	t.Cleanup(l.Release)
	return l
}

func (b *bundle) stats(t *testing.T) connpool.Stats {
	t.Helper()
	s, err := b.pool.Stats(b.ctx)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	return s
}

// eventually polls cond until it holds (a deadlock guard bounds it).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// gatedServer holds every request until gate is closed and records the
// highest number of requests it served at once.
type gatedServer struct {
	*httptest.Server
	gate    chan struct{}
	once    sync.Once
	cur     atomic.Int64
	peak    atomic.Int64
	arrived chan struct{}
}

func newGatedServer(t *testing.T) *gatedServer {
	s := &gatedServer{gate: make(chan struct{}), arrived: make(chan struct{}, 1024)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := s.cur.Add(1)
		defer s.cur.Add(-1)
		for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
		}
		s.arrived <- struct{}{}
		select {
		case <-s.gate:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(s.Close)
	t.Cleanup(s.open) // runs first: a failed test must not leave handlers parked
	return s
}

// open lets every held and later request through.
func (s *gatedServer) open() { s.once.Do(func() { close(s.gate) }) }

func get(ctx context.Context, c *http.Client, u string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return err
}

// TestLeaseBoundsConcurrentRequests: with N = 3×max requests started at
// once, the server never sees more than max of one lease at a time, and sees
// exactly max while the rest wait for a slot.
func TestLeaseBoundsConcurrentRequests(t *testing.T) {
	tests := []struct {
		name   string
		owners int
		max    int
	}{
		{"one slot", 1, 1},
		{"http_connections 4", 1, 4},
		{"default http_connections 20", 1, 20},
		{"two owners, 3 each", 2, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := setup(t, connpool.Config{})
			srv := newGatedServer(t)
			n := 3 * tt.max
			var wg sync.WaitGroup
			errs := make(chan error, n*tt.owners)
			var leases []*connpool.Lease
			for o := range tt.owners {
				l := b.acquire(t, b.owner(t, fmt.Sprintf("owner-%d", o)), tt.max)
				leases = append(leases, l)
				for range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						errs <- get(b.ctx, l.Client(), srv.URL+"/db/doc")
					}()
				}
			}
			limit := tt.owners * tt.max
			for range limit {
				<-srv.arrived
			}
			// Everyone else finds the slots taken and waits.
			eventually(t, "the other requests to wait", func() bool {
				if p := srv.peak.Load(); p > int64(limit) {
					t.Fatalf("server saw %d concurrent requests, limit %d", p, limit)
				}
				return b.stats(t).Waited == uint64(tt.owners*(n-tt.max))
			})
			if got := b.stats(t).InFlight; got != int64(limit) {
				t.Errorf("in flight %d, want %d", got, limit)
			}
			srv.open()
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Errorf("request: %v", err)
				}
			}
			if got := srv.peak.Load(); got != int64(limit) {
				t.Errorf("server saw %d concurrent requests, want exactly %d", got, limit)
			}
			for _, l := range leases {
				u := l.Usage()
				if len(u) != 1 || u[0].Peak != tt.max || u[0].Requests != uint64(n) || u[0].InFlight != 0 {
					t.Errorf("lease usage %+v, want peak %d, %d requests, none in flight", u, tt.max, n)
				}
			}
			s := b.stats(t)
			if s.InFlight != 0 || s.Requests != uint64(tt.owners*n) || s.Leases != tt.owners || s.Owners != tt.owners {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// TestSlotsArePerEndpoint: a lease's limit applies to each endpoint on its
// own, so a busy source does not starve the target.
func TestSlotsArePerEndpoint(t *testing.T) {
	b := setup(t, connpool.Config{})
	a, c := newGatedServer(t), newGatedServer(t)
	l := b.acquire(t, b.owner(t, "owner"), 1)
	var wg sync.WaitGroup
	for _, s := range []*gatedServer{a, c} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := get(b.ctx, l.Client(), s.URL); err != nil {
				t.Errorf("get: %v", err)
			}
		}()
	}
	<-a.arrived // both endpoints hold a request at once
	<-c.arrived
	a.open()
	c.open()
	wg.Wait()
	if u := l.Usage(); len(u) != 2 {
		t.Errorf("usage %+v, want two endpoints", u)
	}
}

func TestEndpointKey(t *testing.T) {
	tests := []struct{ in, want string }{
		{"http://h:5984/db", "http://h:5984"},
		{"http://user:pw@H/db/_changes", "http://h:80"},
		{"https://h/db", "https://h:443"},
		{"http://[::1]:5984/db", "http://[::1]:5984"},
	}
	for _, tt := range tests {
		u, err := url.Parse(tt.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := connpool.EndpointKey(u); got != tt.want {
			t.Errorf("EndpointKey(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// connTracker reports the server side's connection states.
type connTracker struct {
	opened, closed chan net.Conn
}

func trackedServer(t *testing.T) (*httptest.Server, *connTracker) {
	ct := &connTracker{opened: make(chan net.Conn, 16), closed: make(chan net.Conn, 16)}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			ct.opened <- c
		case http.StateClosed:
			ct.closed <- c
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, ct
}

// TestIdleConnectionsClose: a connection left idle for CloseInterval is
// closed by the pool (the server sees it go), and one in use is reused.
func TestIdleConnectionsClose(t *testing.T) {
	b := setup(t, connpool.Config{CloseInterval: 20 * time.Millisecond})
	srv, ct := trackedServer(t)
	l := b.acquire(t, b.owner(t, "owner"), 2)
	if err := get(b.ctx, l.Client(), srv.URL); err != nil {
		t.Fatal(err)
	}
	opened := <-ct.opened
	select {
	case c := <-ct.closed:
		if c != opened {
			t.Errorf("closed an unknown connection")
		}
	case <-time.After(waitLimit):
		t.Fatal("idle connection never closed")
	}
	if l.Err() != nil {
		t.Errorf("lease ended with its connection: %v", l.Err())
	}
}

func TestConnectionsAreReused(t *testing.T) {
	b := setup(t, connpool.Config{CloseInterval: time.Hour})
	srv, ct := trackedServer(t)
	l := b.acquire(t, b.owner(t, "owner"), 2)
	for range 5 {
		if err := get(b.ctx, l.Client(), srv.URL); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(ct.opened); n != 1 {
		t.Errorf("%d connections opened for 5 sequential requests, want 1", n)
	}
}

// TestOwnerDeathReclaimsLease: when the owner actor stops, its in-flight and
// waiting requests are cancelled, its slots return and the lease fails
// later requests with ErrOwnerDied.
func TestOwnerDeathReclaimsLease(t *testing.T) {
	b := setup(t, connpool.Config{})
	srv := newGatedServer(t)
	owner := b.owner(t, "doomed")
	survivor := b.acquire(t, b.owner(t, "survivor"), 1)
	l := b.acquire(t, owner, 1)
	errs := make(chan error, 2)
	for range 2 { // one in flight, one waiting for the slot
		go func() { errs <- get(b.ctx, l.Client(), srv.URL) }()
	}
	<-srv.arrived
	eventually(t, "the second request to wait", func() bool { return b.stats(t).Waited == 1 })

	if err := b.system.Root.StopFuture(owner).Wait(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, connpool.ErrOwnerDied) {
			t.Errorf("request of a dead owner: %v, want ErrOwnerDied", err)
		}
	}
	<-l.Done()
	if err := get(b.ctx, l.Client(), srv.URL); !errors.Is(err, connpool.ErrOwnerDied) {
		t.Errorf("request after reclaim: %v", err)
	}
	s := b.stats(t)
	if s.Reclaimed != 1 || s.Leases != 1 || s.Owners != 1 || s.InFlight != 0 {
		t.Errorf("stats after reclaim %+v", s)
	}
	// Other owners are untouched.
	srv.open()
	if err := get(b.ctx, survivor.Client(), srv.URL); err != nil {
		t.Errorf("survivor: %v", err)
	}
}

func TestLeaseOfADeadOwnerIsReclaimedAtOnce(t *testing.T) {
	b := setup(t, connpool.Config{})
	owner := b.owner(t, "gone")
	if err := b.system.Root.StopFuture(owner).Wait(); err != nil {
		t.Fatal(err)
	}
	l := b.acquire(t, owner, 1)
	select {
	case <-l.Done():
	case <-time.After(waitLimit):
		t.Fatal("lease of a dead owner never ended")
	}
	if !errors.Is(l.Err(), connpool.ErrOwnerDied) {
		t.Errorf("Err = %v", l.Err())
	}
}

func TestReleaseEndsTheLease(t *testing.T) {
	b := setup(t, connpool.Config{})
	srv := newGatedServer(t)
	srv.open()
	owner := b.owner(t, "owner")
	l1, l2 := b.acquire(t, owner, 1), b.acquire(t, owner, 1)
	l1.Release()
	l1.Release() // harmless
	if err := get(b.ctx, l1.Client(), srv.URL); !errors.Is(err, connpool.ErrReleased) {
		t.Errorf("request after Release: %v", err)
	}
	if err := get(b.ctx, l2.Client(), srv.URL); err != nil {
		t.Errorf("other lease of the owner: %v", err)
	}
	s := b.stats(t) // the release notice was sent before this request
	if s.Acquired != 2 || s.Released != 1 || s.Leases != 1 || s.Owners != 1 {
		t.Errorf("stats %+v", s)
	}
	// The owner is still watched for its remaining lease.
	if err := b.system.Root.StopFuture(owner).Wait(); err != nil {
		t.Fatal(err)
	}
	<-l2.Done()
	if !errors.Is(l2.Err(), connpool.ErrOwnerDied) {
		t.Errorf("remaining lease after owner death: %v", l2.Err())
	}
}

func TestAcquireRejectsBadRequests(t *testing.T) {
	b := setup(t, connpool.Config{})
	tests := []struct {
		name  string
		owner *actor.PID
		max   int
	}{
		{"no owner", nil, 4},
		{"zero slots", actor.NewPID("nonhost", "x"), 0},
	}
	for _, tt := range tests {
		if _, err := b.pool.Acquire(b.ctx, tt.owner, tt.max); !errors.Is(err, connpool.ErrInvalidLease) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

// TestKilledPoolRestartsAndLeasesKeepWorking: a chaos kill restarts the
// actor with an empty table; leases from before keep sending, and new ones
// are acquired from the new incarnation.
func TestKilledPoolRestartsAndLeasesKeepWorking(t *testing.T) {
	b := setup(t, connpool.Config{})
	srv := newGatedServer(t)
	srv.open()
	restarted := make(chan struct{}, 1)
	sub := b.system.EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(*supervisor.Event); ok && e.Kind == supervisor.ChildRestarted && e.Child == connpool.Name {
			restarted <- struct{}{}
		}
	})
	defer b.system.EventStream.Unsubscribe(sub)
	old := b.acquire(t, b.owner(t, "old"), 2)

	pid := actor.NewPID(b.system.Address(), "sup/"+connpool.Name)
	if err := supervisor.Kill(b.ctx, b.system, pid, "chaos"); err != nil {
		t.Fatal(err)
	}
	// Acquire right away: served by whichever incarnation runs, waiting
	// for the next one if none does.
	fresh := b.acquire(t, b.owner(t, "new"), 2)
	select {
	case <-restarted:
	case <-time.After(waitLimit):
		t.Fatal("connection_pool not restarted")
	}
	for name, l := range map[string]*connpool.Lease{"old": old, "new": fresh} {
		if err := get(b.ctx, l.Client(), srv.URL); err != nil {
			t.Errorf("%s lease after restart: %v", name, err)
		}
	}
	// The new incarnation knows only what was acquired from it.
	again := b.acquire(t, b.owner(t, "again"), 1)
	if err := get(b.ctx, again.Client(), srv.URL); err != nil {
		t.Fatal(err)
	}
	s := b.stats(t)
	if s.Acquired < 1 || s.Leases != int(s.Acquired) || s.Reclaimed != 0 {
		t.Errorf("stats after restart %+v", s)
	}
	for _, u := range s.Endpoints {
		if u.Owner == "old" {
			t.Errorf("the new incarnation tracks a lease of the old one: %+v", u)
		}
	}
}

func TestAcquireHonoursContext(t *testing.T) {
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// No pool runs in this system: Acquire waits for one until ctx ends.
	_, err := connpool.At(system, actor.NewPID(system.Address(), "couchrep_sup/connection_pool")).Acquire(ctx, actor.NewPID("nonhost", "owner"), 1)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire without a pool: %v", err)
	}
}

// TestLeaseCloseIdle: CloseIdle closes the idle pooled connections of the
// lease's endpoints at once (a job that parks), not after
// connection_close_interval; the lease goes on working.
func TestLeaseCloseIdle(t *testing.T) {
	b := setup(t, connpool.Config{CloseInterval: time.Hour})
	srv, ct := trackedServer(t)
	l := b.acquire(t, b.owner(t, "owner"), 2)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	c, err := l.ClientFor(u, couch.TransportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := get(b.ctx, c, srv.URL); err != nil {
		t.Fatal(err)
	}
	opened := <-ct.opened
	l.CloseIdle()
	select {
	case closed := <-ct.closed:
		if closed != opened {
			t.Errorf("closed an unknown connection")
		}
	case <-time.After(waitLimit):
		t.Fatal("CloseIdle left the idle connection open")
	}
	if err := get(b.ctx, c, srv.URL); err != nil {
		t.Fatalf("a request after CloseIdle: %v", err)
	}
}
