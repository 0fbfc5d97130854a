package startlimit

import (
	"context"
	"errors"
	"testing"
	"time"
)

// tryAcquire starts an Acquire of key in the background: its release
// arrives on the channel once it has a slot.
func tryAcquire(l *Limiter, key string) (<-chan func(), context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan func(), 1)
	go func() {
		if rel, err := l.Acquire(ctx, key); err == nil {
			got <- rel
		}
	}()
	return got, cancel
}

func mustGet(t *testing.T, got <-chan func(), what string) func() {
	t.Helper()
	select {
	case rel := <-got:
		return rel
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no slot", what)
		return nil
	}
}

func mustWait(t *testing.T, got <-chan func(), what string) {
	t.Helper()
	select {
	case <-got:
		t.Fatalf("%s: got a slot, want to wait", what)
	case <-time.After(50 * time.Millisecond): // nothing to wait for: proves the absence of a grant
	}
}

func TestLimiter(t *testing.T) {
	tests := []struct {
		name  string
		limit int
		// starts jobs at key "a" beyond the limit wait
		over int
	}{
		{"one at a time", 1, 2},
		{"three at a time", 3, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := New(tc.limit)
			var rels []func()
			for i := range tc.limit {
				rel, err := l.Acquire(context.Background(), "a")
				if err != nil {
					t.Fatalf("acquire %d: %v", i, err)
				}
				rels = append(rels, rel)
			}
			// Another server is not held up by a's.
			relB, err := l.Acquire(context.Background(), "b")
			if err != nil {
				t.Fatal(err)
			}
			var waiting []<-chan func()
			for range tc.over {
				got, cancel := tryAcquire(l, "a")
				defer cancel()
				waiting = append(waiting, got)
				// In order: wait until this one is queued.
				for l.Stats().Waiting < len(waiting) {
					time.Sleep(time.Millisecond) // the goroutine's progress: poll
				}
			}
			mustWait(t, waiting[0], "over the limit")
			if st := l.Stats(); st.Starting != tc.limit+1 || st.Waiting != tc.over || st.Servers != 2 {
				t.Errorf("stats %+v, want %d starting, %d waiting, 2 servers", st, tc.limit+1, tc.over)
			}
			// A release hands the slot to the first waiter, first come first served.
			rels[0]()
			rels[0]() // idempotent: no second slot
			next := mustGet(t, waiting[0], "first waiter after a release")
			if tc.over > 1 {
				mustWait(t, waiting[1], "second waiter after one release")
			}
			next()
			for _, rel := range rels[1:] {
				rel()
			}
			for _, w := range waiting[1:] {
				mustGet(t, w, "waiter")()
			}
			relB()
			if st := l.Stats(); st != (Stats{}) {
				t.Errorf("stats after every release %+v, want none", st)
			}
		})
	}
}

func TestLimiterCancel(t *testing.T) {
	l := New(1)
	rel, err := l.Acquire(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("job stopped")
	done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, "a")
		done <- err
	}()
	for l.Stats().Waiting < 1 {
		time.Sleep(time.Millisecond) // the goroutine's progress: poll
	}
	cancel(stop)
	if err := <-done; !errors.Is(err, stop) {
		t.Fatalf("canceled Acquire: %v, want %v", err, stop)
	}
	if st := l.Stats(); st.Waiting != 0 || st.Starting != 1 {
		t.Errorf("stats %+v, want 1 starting, none waiting", st)
	}
	rel()
	if st := l.Stats(); st != (Stats{}) {
		t.Errorf("stats %+v, want none", st)
	}
}

func TestLimiterSetLimitAndOff(t *testing.T) {
	l := New(1)
	rel, _ := l.Acquire(context.Background(), "a")
	got, cancel := tryAcquire(l, "a")
	defer cancel()
	for l.Stats().Waiting < 1 {
		time.Sleep(time.Millisecond) // the goroutine's progress: poll
	}
	l.SetLimit(2)
	mustGet(t, got, "after raising the limit")()
	rel()
	l.SetLimit(0)
	for range 100 {
		if _, err := l.Acquire(context.Background(), "a"); err != nil {
			t.Fatal(err)
		}
	}
	var nilL *Limiter
	if r, err := nilL.Acquire(context.Background(), "a"); err != nil || r == nil {
		t.Fatalf("nil limiter: %v", err)
	}
}

func TestServerOf(t *testing.T) {
	tests := []struct{ in, want string }{
		{"http://admin:secret@127.0.0.1:5984/userdb-61/", "http://127.0.0.1:5984"},
		{"https://example.com/db", "https://example.com"},
		{"http://[::1]:5984/a%2Fb", "http://[::1]:5984"},
	}
	for _, tc := range tests {
		if got := ServerOf(tc.in); got != tc.want {
			t.Errorf("ServerOf(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestLimiterRequests: Request bounds the start-up requests in flight per
// server to the same n, apart from the jobs' slots: n jobs holding their
// slots do not keep their requests from going out, and a request waits
// only for another request.
func TestLimiterRequests(t *testing.T) {
	l := New(2)
	var jobs []func()
	for range 2 {
		rel, err := l.Acquire(context.Background(), "a")
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, rel)
	}
	r1, err := l.Request(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.Request(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	// Another server's requests are not held up by a's.
	rb, err := l.Request(context.Background(), "b")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan func(), 1)
	go func() {
		if rel, err := l.Request(ctx, "a"); err == nil {
			got <- rel
		}
	}()
	mustWait(t, got, "a third request at a")
	r1()
	r1() // idempotent
	r3 := mustGet(t, got, "the third request after one ended")
	for _, rel := range append(jobs, r2, r3, rb) {
		rel()
	}
	if st := l.Stats(); st != (Stats{}) {
		t.Errorf("stats %+v, want none", st)
	}
	l.SetLimit(0)
	for range 10 {
		if _, err := l.Request(context.Background(), "a"); err != nil {
			t.Fatal(err)
		}
	}
}
