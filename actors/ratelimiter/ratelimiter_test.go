package ratelimiter

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"))
}

const waitLimit = 30 * time.Second

// clock is a settable time source.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type bundle struct {
	system *actor.ActorSystem
	pid    *actor.PID
	lim    *Limiter
	clock  *clock
	ctx    context.Context
}

func setup(t testing.TB) *bundle {
	t.Helper()
	return setupWith(t, Config{})
}

func setupWith(t testing.TB, cfg Config) *bundle {
	t.Helper()
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	c := &clock{now: time.Unix(1700000000, 0)}
	sup, err := supervisor.Start(ctx, system, "sup", supervisor.Spec{
		Strategy: supervisor.OneForOne, MaxRestarts: 10, Period: time.Minute,
		Children: []supervisor.ChildSpec{{Name: Name, Props: Props(Config{Clock: c.Now, Logger: zerolog.Nop(), CleanupPeriod: cfg.CleanupPeriod})}},
	})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = sup.Stop(context.Background()) })
	pid := actor.NewPID(system.Address(), "sup/"+Name)
	return &bundle{system: system, pid: pid, lim: At(system, pid), clock: c, ctx: ctx}
}

var key = couch.LimitKey{Endpoint: "http://h:5984/db/", Method: "POST"}

func (b *bundle) snapshot(t *testing.T) []replicate.RateLimit {
	t.Helper()
	s, err := b.lim.Snapshot(b.ctx)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	return s
}

// TestLimiterFollowsCouchDB drives the node's limiter through the handle a
// job gets and checks CouchDB's numbers (the arithmetic itself is tested
// in internal/replicate).
func TestLimiterFollowsCouchDB(t *testing.T) {
	b := setup(t)
	var l couch.Limiter = b.lim
	steps := []struct {
		op   string
		want time.Duration
	}{
		{"failure", 24 * time.Millisecond},
		{"failure", 29 * time.Millisecond},
		{"failure", 35 * time.Millisecond},
		{"success", 20 * time.Millisecond},
		{"success", 0},
	}
	for i, s := range steps {
		b.clock.Advance(100 * time.Millisecond) // outside the 80 ms window
		if s.op == "failure" {
			l.Failure(key)
		} else {
			l.Success(key)
		}
		if got := b.lim.Interval(key); got != s.want {
			t.Fatalf("step %d (%s): interval %v, want %v", i, s.op, got, s.want)
		}
	}
}

func TestMaxBackoff(t *testing.T) {
	b := setup(t)
	for b.lim.Interval(key) < replicate.RateLimitMaxInterval {
		b.clock.Advance(100 * time.Millisecond)
		b.lim.Failure(key)
	}
	if err := b.lim.Wait(b.ctx, key); !errors.Is(err, replicate.ErrMaxBackoff) {
		t.Errorf("Wait at the maximum interval: %v", err)
	}
}

func TestSnapshotAndReset(t *testing.T) {
	b := setup(t)
	other := couch.LimitKey{Endpoint: key.Endpoint, Method: "GET"}
	b.lim.Failure(key)
	b.lim.Failure(other)
	if s := b.snapshot(t); len(s) != 2 || s[0].Key != other || s[1].Key != key || s[1].Interval != 24*time.Millisecond {
		t.Fatalf("snapshot %+v", s)
	}
	tests := []struct {
		name string
		key  *couch.LimitKey
		want int
		left int
	}{
		{"one key", &key, 1, 1},
		{"unknown key", &key, 0, 1},
		{"all", nil, 1, 0},
	}
	for _, tt := range tests {
		n, err := b.lim.Reset(b.ctx, tt.key)
		if err != nil || n != tt.want || len(b.snapshot(t)) != tt.left {
			t.Errorf("%s: Reset = %d, %v; left %v", tt.name, n, err, b.snapshot(t))
		}
	}
}

// TestCleanupDropsStaleEntries sends the actor its cleanup tick (as its
// timer does every 50 s) after the clock moved past 25 s for one key.
func TestCleanupDropsStaleEntries(t *testing.T) {
	b := setup(t)
	stale := couch.LimitKey{Endpoint: "http://old/db/", Method: "GET"}
	b.lim.Failure(stale)
	b.clock.Advance(replicate.RateLimitMaxInterval + time.Millisecond)
	b.lim.Failure(key)
	b.system.Root.Send(b.pid, &cleanupTick{table: b.lim.slot.table.Load()})
	if s := b.snapshot(t); len(s) != 1 || s[0].Key != key {
		t.Errorf("after cleanup %+v, want only the fresh key", s)
	}
	// A tick of an earlier incarnation is ignored.
	b.clock.Advance(time.Hour)
	b.system.Root.Send(b.pid, &cleanupTick{table: replicate.NewRateLimiter(nil)})
	if s := b.snapshot(t); len(s) != 1 {
		t.Errorf("a foreign tick cleaned the table: %+v", s)
	}
}

// TestCleanupTimer: the actor's own timer runs the cleanup.
func TestCleanupTimer(t *testing.T) {
	b := setupWith(t, Config{CleanupPeriod: time.Millisecond})
	b.lim.Failure(key)
	b.clock.Advance(replicate.RateLimitMaxInterval + time.Millisecond)
	deadline := time.Now().Add(waitLimit)
	for len(b.snapshot(t)) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("stale entry never cleaned up")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestKilledLimiterRestartsEmptyAndHandlesKeepWorking: the state is lost
// with the incarnation (as CouchDB's ETS tables); the handle a job holds
// reaches the new table.
func TestKilledLimiterRestartsEmptyAndHandlesKeepWorking(t *testing.T) {
	b := setup(t)
	restarted := make(chan struct{}, 1)
	sub := b.system.EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(*supervisor.Event); ok && e.Kind == supervisor.ChildRestarted && e.Child == Name {
			restarted <- struct{}{}
		}
	})
	defer b.system.EventStream.Unsubscribe(sub)
	b.lim.Failure(key)
	before := b.lim.slot.table.Load()
	if err := supervisor.Kill(b.ctx, b.system, b.pid, "chaos"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-restarted:
	case <-time.After(waitLimit):
		t.Fatal("rate_limiter not restarted")
	}
	if b.lim.slot.table.Load() == before {
		t.Fatal("the new incarnation kept the old table")
	}
	if s := b.snapshot(t); len(s) != 0 {
		t.Errorf("table after restart %+v, want empty", s)
	}
	b.clock.Advance(100 * time.Millisecond)
	b.lim.Failure(key)
	if got := b.lim.Interval(key); got != 24*time.Millisecond {
		t.Errorf("interval after restart %v, want 24ms", got)
	}
}

func TestNotRunning(t *testing.T) {
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	l := At(system, actor.NewPID(system.Address(), "couchrep_sup/"+Name))
	l.Failure(key) // dropped
	if err := l.Wait(context.Background(), key); err != nil || l.Interval(key) != 0 {
		t.Errorf("limiter without an actor: Wait %v, interval %v", err, l.Interval(key))
	}
	if _, err := l.Snapshot(context.Background()); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Snapshot without an actor: %v", err)
	}
}

// held wraps the actor so that a test can hold it: on a *hold message it
// blocks until the test releases it.
type held struct{ *limiterActor }

type hold struct{ entered, release chan struct{} }

func (h held) Receive(ctx actor.Context) {
	if m, ok := ctx.Message().(*hold); ok {
		close(m.entered)
		<-m.release
		return
	}
	h.limiterActor.Receive(ctx)
}

// posted reports every snapshot request posted to the actor's mailbox.
type posted chan struct{}

func (p posted) MailboxStarted()     {}
func (p posted) MessageReceived(any) {}
func (p posted) MailboxEmpty()       {}
func (p posted) MessagePosted(msg any) {
	if _, ok := msg.(*snapshotRequest); ok {
		p <- struct{}{}
	}
}

// TestAskOutlivesKilledIncarnation: a Snapshot sent to an incarnation that
// is killed before it answers (the kill is ahead of the request in the held
// actor's mailbox, so the request is lost with the incarnation) is asked
// again of the restarted incarnation, and returns its answer long before
// the caller's context (minutes) ends.
func TestAskOutlivesKilledIncarnation(t *testing.T) {
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := &clock{now: time.Unix(1700000000, 0)}
	cfg := Config{Clock: c.Now, Logger: zerolog.Nop(), CleanupPeriod: time.Hour}
	sent := make(posted, 8)
	props := actors.Props(func() actor.Actor { return held{&limiterActor{cfg: cfg, log: cfg.Logger}} },
		actors.WithPropsOptions(actor.WithMailbox(actor.Unbounded(sent))))
	sup, err := supervisor.Start(ctx, system, "sup", supervisor.Spec{
		Strategy: supervisor.OneForOne, MaxRestarts: 10, Period: time.Minute,
		Children: []supervisor.ChildSpec{{Name: Name, Props: props}},
	})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	defer func() { _ = sup.Stop(context.Background()) }()
	pid := actor.NewPID(system.Address(), "sup/"+Name)
	lim := At(system, pid)
	lim.Failure(key) // the old incarnation's table has one entry
	old := lim.slot.table.Load()

	h := &hold{entered: make(chan struct{}), release: make(chan struct{})}
	system.Root.Send(pid, h)
	<-h.entered
	system.Root.Send(pid, &messages.KillRequest{Reason: "chaos"})
	type result struct {
		s   []replicate.RateLimit
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := lim.Snapshot(ctx)
		done <- result{s, err}
	}()
	<-sent // the request is in the held incarnation's mailbox, behind the kill
	close(h.release)
	r := <-done
	if r.err != nil {
		t.Fatalf("Snapshot across the kill: %v", r.err)
	}
	if ctx.Err() != nil {
		t.Fatalf("Snapshot returned only when its context ended: %v", ctx.Err())
	}
	if len(r.s) != 0 {
		t.Errorf("Snapshot answered %+v, want the restarted incarnation's empty table", r.s)
	}
	if lim.slot.table.Load() == old {
		t.Error("the answer came from the killed incarnation")
	}
}
