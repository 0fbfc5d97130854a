package cluster

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/messages"
)

func openTestDB(t *testing.T) kv.Database {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "c.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// TestClaim: a node name is refused while a live node holds it, unless
// the holder is a process of the same host and data directory that no
// longer runs (a node restarted after a crash); it is free once the
// holder's lease expired or it left.
func TestClaim(t *testing.T) {
	const iv = time.Second
	first := Owner{Host: "h1", DataDir: "/var/lib/a", PID: 100}
	for _, tc := range []struct {
		name string
		// before runs between the first claim (by first, at t0) and the
		// second.
		before func(t *testing.T, r *Registry, c *clock, inc string)
		second Owner
		gone   map[int64]bool
		// wantExpires is the refused claim's lease expiry after t0 (0: the
		// claim succeeds).
		wantExpires time.Duration
	}{
		{name: "other data directory, same host", second: Owner{Host: "h1", DataDir: "/var/lib/b", PID: 200}, gone: map[int64]bool{100: true}, wantExpires: 3 * iv},
		{name: "other host", second: Owner{Host: "h2", DataDir: "/var/lib/a", PID: 200}, gone: map[int64]bool{100: true}, wantExpires: 3 * iv},
		{name: "same data directory, holder still runs", second: Owner{Host: "h1", DataDir: "/var/lib/a", PID: 200}, wantExpires: 3 * iv},
		{name: "same process (embedding API)", second: first, wantExpires: 3 * iv},
		{name: "same data directory, holder gone", second: Owner{Host: "h1", DataDir: "/var/lib/a", PID: 200}, gone: map[int64]bool{100: true}},
		{
			name: "heartbeats extend the lease",
			before: func(t *testing.T, r *Registry, c *clock, inc string) {
				c.add(2 * iv)
				if err := r.Heartbeat(t.Context(), &messages.NodeRecord{Name: "n", Incarnation: "real", HeartbeatIntervalMs: iv.Milliseconds()}); err != nil {
					t.Fatal(err)
				}
				c.add(2 * iv)
			},
			second: Owner{Host: "h2", PID: 200}, wantExpires: 5 * iv,
		},
		{
			name:   "lease expired",
			before: func(t *testing.T, r *Registry, c *clock, inc string) { c.add(3*iv + time.Millisecond) },
			second: Owner{Host: "h2", PID: 200},
		},
		{
			name: "holder left",
			before: func(t *testing.T, r *Registry, c *clock, inc string) {
				if err := r.Leave(t.Context(), "n", inc); err != nil {
					t.Fatal(err)
				}
			},
			second: Owner{Host: "h2", PID: 200},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			c := &clock{now: t0}
			r := New(openTestDB(t), Options{Clock: c.Now, ProcessGone: func(pid int64) bool { return tc.gone[pid] }})
			inc, err := r.Claim(t.Context(), "n", first, iv)
			if err != nil || !strings.HasPrefix(inc, "claim-") {
				t.Fatalf("first claim: %q, %v", inc, err)
			}
			if tc.before != nil {
				tc.before(t, r, c, inc)
			}
			_, err = r.Claim(t.Context(), "n", tc.second, iv)
			if tc.wantExpires == 0 {
				if err != nil {
					t.Fatalf("second claim: %v, want it to succeed", err)
				}
				if o, ok, err := r.Owner(t.Context(), "n"); err != nil || !ok || o != tc.second {
					t.Fatalf("owner after the second claim = %+v %v %v, want %+v", o, ok, err, tc.second)
				}
				return
			}
			var inUse *NameInUseError
			if !errors.Is(err, ErrNameInUse) || !errors.As(err, &inUse) {
				t.Fatalf("second claim: %v, want a NameInUseError", err)
			}
			if inUse.Holder != first || !inUse.Expires.Equal(t0.Add(tc.wantExpires)) {
				t.Fatalf("refusal names holder %+v, lease expiry %v; want %+v, %v", inUse.Holder, inUse.Expires, first, t0.Add(tc.wantExpires))
			}
			for _, want := range []string{`"n"`, "pid 100", "host h1", "/var/lib/a", t0.Add(tc.wantExpires).Format(time.RFC3339Nano), "--node-name"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if o, _, _ := r.Owner(t.Context(), "n"); o != first {
				t.Fatalf("a refused claim changed the owner to %+v", o)
			}
		})
	}
}

// TestClaimKeepsDrainFlag: a node that claims its name again keeps its
// drain flag, and the claim is a live record at once (a racing claim sees
// it).
func TestClaimKeepsDrainFlag(t *testing.T) {
	c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	r := New(openTestDB(t), Options{Clock: c.Now})
	if err := r.SetDraining(t.Context(), "n", true); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Claim(t.Context(), "n", Owner{Host: "h", PID: 1}, time.Second); err != nil {
		t.Fatal(err)
	}
	if d, err := r.Draining(t.Context(), "n"); err != nil || !d {
		t.Fatalf("draining after a claim = %v, %v; want true", d, err)
	}
	ms, err := r.Members(t.Context())
	if err != nil || len(ms) != 1 || !ms[0].Alive || ms[0].GetPid() != 1 {
		t.Fatalf("members after a claim = %v, %v; want n alive with pid 1", ms, err)
	}
}

// TestForgetClearsOwner: forgetting a long-gone node forgets its owner.
func TestForgetClearsOwner(t *testing.T) {
	c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	r := New(openTestDB(t), Options{Clock: c.Now})
	if _, err := r.Claim(t.Context(), "n", Owner{Host: "h", PID: 1}, time.Second); err != nil {
		t.Fatal(err)
	}
	c.add(2 * time.Hour)
	if n, err := r.Forget(t.Context(), time.Hour); err != nil || n != 1 {
		t.Fatalf("forget: %d, %v; want 1", n, err)
	}
	if _, ok, err := r.Owner(t.Context(), "n"); err != nil || ok {
		t.Fatalf("owner after forget: found %v, %v; want none", ok, err)
	}
}

func TestSharedUUID(t *testing.T) {
	const a, b = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	for _, tc := range []struct {
		name     string
		recorded string // in the store before ("" none)
		req      UUIDRequest
		want     UUIDResult
		mismatch string // the refusal's RecordedIn ("" no refusal)
	}{
		{name: "first node records a generated uuid", req: UUIDRequest{UUID: a, Generated: true}, want: UUIDResult{UUID: a}},
		{name: "first node records a configured uuid", req: UUIDRequest{UUID: a}, want: UUIDResult{UUID: a}},
		{name: "generated uuid yields to the store's", recorded: a, req: UUIDRequest{UUID: b, Generated: true}, want: UUIDResult{UUID: a}},
		{name: "configured uuid equal to the store's", recorded: a, req: UUIDRequest{UUID: a, DataDir: b}, want: UUIDResult{UUID: a}},
		{name: "configured uuid differs from the store's", recorded: a, req: UUIDRequest{UUID: b}, mismatch: "the job store"},
		{name: "configured uuid differs from the data directory's", req: UUIDRequest{UUID: b, DataDir: a}, mismatch: "the data directory"},
		{name: "configured uuid equal to the data directory's", req: UUIDRequest{UUID: a, DataDir: a}, want: UUIDResult{UUID: a}},
		{name: "adopted uuid replaces the store's", recorded: a, req: UUIDRequest{UUID: b, Adopted: true}, want: UUIDResult{UUID: b, Replaced: a}},
		{name: "adopted uuid equal to the store's", recorded: a, req: UUIDRequest{UUID: a, Adopted: true}, want: UUIDResult{UUID: a}},
		{name: "adopted uuid in a new store", req: UUIDRequest{UUID: b, Adopted: true}, want: UUIDResult{UUID: b}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := openTestDB(t)
			if tc.recorded != "" {
				if _, err := SharedUUID(t.Context(), db, UUIDRequest{UUID: tc.recorded}); err != nil {
					t.Fatal(err)
				}
			}
			got, err := SharedUUID(t.Context(), db, tc.req)
			after, rerr := SharedUUID(t.Context(), db, UUIDRequest{UUID: "c", Generated: true})
			if rerr != nil {
				t.Fatal(rerr)
			}
			if tc.mismatch != "" {
				var mm *UUIDMismatchError
				if !errors.Is(err, ErrUUIDMismatch) || !errors.As(err, &mm) || mm.RecordedIn != tc.mismatch || mm.Configured != tc.req.UUID {
					t.Fatalf("SharedUUID = %+v, %v; want a mismatch with %s", got, err, tc.mismatch)
				}
				for _, want := range []string{tc.req.UUID, mm.Recorded, "--adopt-uuid " + tc.req.UUID, "remove [couchdb] uuid"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
				if wantStore := tc.recorded; after.UUID != wantStore && !(wantStore == "" && after.UUID == "c") {
					t.Fatalf("a refused uuid changed the store's to %q", after.UUID)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("SharedUUID = %+v, %v; want %+v", got, err, tc.want)
			}
			if after.UUID != tc.want.UUID {
				t.Fatalf("the store records %q, want %q", after.UUID, tc.want.UUID)
			}
		})
	}
}

// TestProcessGone: this process runs; a child that exited and was waited
// for does not.
func TestProcessGone(t *testing.T) {
	if processGone(int64(os.Getpid())) {
		t.Fatal("this process counts as gone")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("no true(1): %v", err)
	}
	if !processGone(int64(cmd.Process.Pid)) {
		t.Fatalf("exited child %d counts as running", cmd.Process.Pid)
	}
}

// TestHeartbeatAfterTakeover: a registry heartbeating for an owner fails
// with ErrNameTaken, writing nothing, once another process claimed the
// name; without a recorded owner, or as the recorded one, it heartbeats.
func TestHeartbeatAfterTakeover(t *testing.T) {
	c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	db := openTestDB(t)
	me := Owner{Host: "h1", DataDir: "/a", PID: 1}
	mine := New(db, Options{Clock: c.Now, Owner: &me})
	rec := &messages.NodeRecord{Name: "n", Incarnation: "i1", HeartbeatIntervalMs: 1000}
	if err := mine.Heartbeat(t.Context(), rec); err != nil {
		t.Fatalf("heartbeat without a recorded owner: %v", err)
	}
	if _, err := mine.Claim(t.Context(), "n", me, time.Second); err == nil {
		t.Fatal("a claim under a live record of the same pid succeeded")
	}
	c.add(4 * time.Second) // the lease ran out: paused, or cut off from the store
	other := Owner{Host: "h2", DataDir: "/b", PID: 2}
	if _, err := New(db, Options{Clock: c.Now}).Claim(t.Context(), "n", other, time.Second); err != nil {
		t.Fatalf("claim after the lease expired: %v", err)
	}
	err := mine.Heartbeat(t.Context(), rec)
	if !errors.Is(err, ErrNameTaken) || !strings.Contains(err.Error(), "pid 2 on host h2") {
		t.Fatalf("heartbeat after the takeover: %v, want ErrNameTaken naming the new owner", err)
	}
	ms, err := mine.Members(t.Context())
	if err != nil || len(ms) != 1 || ms[0].GetPid() != 2 || ms[0].GetIncarnation() == "i1" {
		t.Fatalf("members after the refused heartbeat: %v, %v; want the new holder's record", ms, err)
	}
	theirs := New(db, Options{Clock: c.Now, Owner: &other})
	if err := theirs.Heartbeat(t.Context(), &messages.NodeRecord{Name: "n", Incarnation: "i2", HeartbeatIntervalMs: 1000}); err != nil {
		t.Fatalf("the new owner's heartbeat: %v", err)
	}
}
