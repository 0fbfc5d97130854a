package cluster

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/messages"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestStability(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	steps := []struct {
		at      time.Duration
		members []string
		want    Transition
		stable  bool
	}{
		{0, []string{"a"}, BecameUnstable, false},
		{5 * time.Second, []string{"a"}, NoChange, false},
		{10 * time.Second, []string{"a"}, BecameStable, true},
		{11 * time.Second, []string{"a"}, NoChange, true},
		{12 * time.Second, []string{"b", "a"}, BecameUnstable, false},
		{13 * time.Second, []string{"a", "b"}, NoChange, false},  // order does not matter
		{15 * time.Second, []string{"a"}, BecameUnstable, false}, // restarts the quiet period
		{24 * time.Second, []string{"a"}, NoChange, false},
		{25 * time.Second, []string{"a"}, BecameStable, true},
	}
	s := NewStability(10 * time.Second)
	for i, st := range steps {
		got := s.Observe(st.members, t0.Add(st.at))
		if got != st.want || s.Stable() != st.stable {
			t.Fatalf("step %d (%v %v): got %v stable %v, want %v stable %v", i, st.at, st.members, got, s.Stable(), st.want, st.stable)
		}
	}
}

func TestRegistry(t *testing.T) {
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "c.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	r := New(db, Options{Clock: c.Now})
	ctx := t.Context()
	rec := func(name, inc string) *messages.NodeRecord {
		return &messages.NodeRecord{Name: name, Incarnation: inc, HeartbeatIntervalMs: 1000, Types: []string{"replication"}}
	}
	for _, n := range []*messages.NodeRecord{rec("b", "1"), rec("a", "1")} {
		if err := r.Heartbeat(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	c.add(2 * time.Second)
	if err := r.Heartbeat(ctx, rec("a", "1")); err != nil {
		t.Fatal(err)
	}
	// b restarted as a new incarnation; the old one's Leave must not mark it.
	if err := r.Heartbeat(ctx, rec("b", "2")); err != nil {
		t.Fatal(err)
	}
	if err := r.Leave(ctx, "b", "1"); err != nil {
		t.Fatal(err)
	}
	if err := r.Heartbeat(ctx, rec("c", "1")); err != nil {
		t.Fatal(err)
	}
	if err := r.Leave(ctx, "c", "1"); err != nil {
		t.Fatal(err)
	}
	c.add(2 * time.Second) // within 3 intervals of the last heartbeats
	tests := []struct {
		at    time.Duration
		alive map[string]bool
	}{
		{0, map[string]bool{"a": true, "b": true, "c": false}},
		{2 * time.Second, map[string]bool{"a": false, "b": false, "c": false}},
	}
	for _, tc := range tests {
		c.add(tc.at)
		ms, err := r.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != 3 || ms[0].GetName() != "a" || ms[1].GetName() != "b" || ms[2].GetName() != "c" {
			t.Fatalf("members %v", ms)
		}
		for _, m := range ms {
			if m.Alive != tc.alive[m.GetName()] {
				t.Fatalf("+%v: %s alive %v, want %v", tc.at, m.GetName(), m.Alive, tc.alive[m.GetName()])
			}
		}
	}
	n, err := r.Forget(ctx, time.Hour)
	if err != nil || n != 0 {
		t.Fatalf("forget recent: %d %v", n, err)
	}
	c.add(2 * time.Hour)
	if err := r.Heartbeat(ctx, rec("a", "1")); err != nil {
		t.Fatal(err)
	}
	n, err = r.Forget(ctx, time.Hour)
	if err != nil || n != 2 {
		t.Fatalf("forget old: %d %v, want 2", n, err)
	}
	if ms, _ := r.Members(ctx); len(ms) != 1 || !ms[0].Alive {
		t.Fatalf("after forget: %v", ms)
	}
}

// TestDraining: the drain flag survives heartbeats (which carry none), a
// leave and a new incarnation under the same name, until it is cleared.
func TestDraining(t *testing.T) {
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "c.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	r := New(db, Options{})
	ctx := t.Context()
	rec := func(inc string) *messages.NodeRecord {
		return &messages.NodeRecord{Name: "a", Incarnation: inc, HeartbeatIntervalMs: 1000}
	}
	draining := func() bool {
		t.Helper()
		d, err := r.Draining(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		ms, err := r.Members(ctx)
		if err != nil || len(ms) != 1 || ms[0].GetDraining() != d {
			t.Fatalf("members %v (%v) disagree with Draining %v", ms, err, d)
		}
		return d
	}
	steps := []struct {
		name string
		do   func() error
		want bool
	}{
		{"first heartbeat", func() error { return r.Heartbeat(ctx, rec("1")) }, false},
		{"drain", func() error { return r.SetDraining(ctx, "a", true) }, true},
		{"heartbeat", func() error { return r.Heartbeat(ctx, rec("1")) }, true},
		{"leave", func() error { return r.Leave(ctx, "a", "1") }, true},
		{"restarted", func() error { return r.Heartbeat(ctx, rec("2")) }, true},
		{"undrain", func() error { return r.SetDraining(ctx, "a", false) }, false},
		{"heartbeat after undrain", func() error { return r.Heartbeat(ctx, rec("2")) }, false},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := draining(); got != st.want {
			t.Fatalf("after %s: draining %v, want %v", st.name, got, st.want)
		}
	}
}
