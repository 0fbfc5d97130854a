package share_test

import (
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/internal/share"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func TestClampShares(t *testing.T) {
	tests := []struct{ in, want int }{
		{-5, 1}, {0, 1}, {1, 1}, {100, 100}, {1000, 1000}, {1001, 1000}, {math.MaxInt, 1000},
	}
	for _, tc := range tests {
		if got := share.ClampShares(tc.in); got != tc.want {
			t.Errorf("ClampShares(%d) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestKey(t *testing.T) {
	tests := []struct{ db, user, want string }{
		{"_replicator", "bob", "_replicator"},
		{"a/_replicator", "", "a/_replicator"},
		{"", "bob", "bob"},
	}
	for _, tc := range tests {
		if got := share.Key(tc.db, tc.user); got != tc.want {
			t.Errorf("Key(%q, %q) = %q, want %q", tc.db, tc.user, got, tc.want)
		}
	}
}

func TestSharesSetResetClamp(t *testing.T) {
	l := share.NewLedger(share.Params{})
	tests := []struct {
		set, want int
	}{{200, 200}, {5000, 1000}, {0, 1}, {100, 100}}
	for _, tc := range tests {
		if got := l.SetShares("x", tc.set); got != tc.want || l.Shares("x") != tc.want {
			t.Errorf("SetShares(%d) = %d, Shares = %d, want %d", tc.set, got, l.Shares("x"), tc.want)
		}
	}
	l.SetShares("x", 7)
	l.ResetShares("x")
	if got := l.Shares("x"); got != share.DefaultShares {
		t.Errorf("after reset Shares = %d, want %d", got, share.DefaultShares)
	}
	if got := l.Shares("never-set"); got != share.DefaultShares {
		t.Errorf("default Shares = %d", got)
	}
}

// TestChargeScalesWithShares: one minute of running costs 60e6 virtual µs at
// 100 shares, half at 200, double at 50 (no decay: HalfLife < 0).
func TestChargeScalesWithShares(t *testing.T) {
	tests := []struct {
		shares int
		ran    time.Duration
		want   uint64
	}{
		{100, time.Minute, 60_000_000},
		{200, time.Minute, 30_000_000},
		{50, time.Minute, 120_000_000},
		{1, time.Second, 100_000_000},
		{1000, time.Second, 100_000},
		{100, 0, 0},
		{100, -time.Second, 0}, // refund below zero floors at zero
	}
	for _, tc := range tests {
		l := share.NewLedger(share.Params{HalfLife: -1})
		l.SetShares("k", tc.shares)
		l.Charge("k", tc.ran, t0)
		if got := l.Peek("k", t0); got != tc.want {
			t.Errorf("shares %d ran %v: finish %d, want %d", tc.shares, tc.ran, got, tc.want)
		}
	}
}

// TestEnqueueSpacesDeadlines: jobs enqueued together by one key get
// deadlines one quantum (scaled by shares) apart, starting at the frontier.
func TestEnqueueSpacesDeadlines(t *testing.T) {
	l := share.NewLedger(share.Params{Quantum: time.Minute, HalfLife: -1})
	l.SetShares("b", 200)
	l.Accepted(1_000_000)
	var a, b []uint64
	for range 3 {
		a = append(a, l.Enqueue("a", t0))
		b = append(b, l.Enqueue("b", t0))
	}
	wantA := []uint64{61_000_000, 121_000_000, 181_000_000}
	wantB := []uint64{31_000_000, 61_000_000, 91_000_000}
	for i := range 3 {
		if a[i] != wantA[i] || b[i] != wantB[i] {
			t.Fatalf("deadlines a=%v b=%v, want a=%v b=%v", a, b, wantA, wantB)
		}
	}
}

// TestIdleKeyKeepsNoCredit: a key behind the frontier starts at the frontier.
func TestIdleKeyKeepsNoCredit(t *testing.T) {
	l := share.NewLedger(share.Params{Quantum: time.Second, HalfLife: -1})
	l.Charge("old", time.Second, t0) // finish 1e6
	l.Accepted(50_000_000)
	if got := l.Peek("old", t0); got != 50_000_000 {
		t.Errorf("Peek of idle key = %d, want the frontier", got)
	}
	if got := l.Enqueue("old", t0); got != 51_000_000 {
		t.Errorf("Enqueue = %d, want frontier + quantum", got)
	}
	if l.Accepted(10); l.Frontier() != 50_000_000 {
		t.Errorf("frontier went backwards: %d", l.Frontier())
	}
}

// TestDebtDecaysLazily: debt above the frontier halves every half-life,
// computed when read.
func TestDebtDecaysLazily(t *testing.T) {
	l := share.NewLedger(share.Params{HalfLife: time.Hour})
	l.Accepted(1000)
	l.Charge("k", 64*time.Second, t0) // debt 64e6 µs
	tests := []struct {
		after time.Duration
		want  time.Duration
	}{
		{0, 64 * time.Second},
		{time.Hour, 32 * time.Second},
		{2 * time.Hour, 16 * time.Second},
		{6 * time.Hour, time.Second},
	}
	for _, tc := range tests {
		got := l.Debt("k", t0.Add(tc.after))
		if d := got - tc.want; d < -time.Millisecond || d > time.Millisecond {
			t.Errorf("debt after %v = %v, want %v", tc.after, got, tc.want)
		}
	}
	if n := l.Prune(t0.Add(100 * time.Hour)); n != 1 {
		t.Errorf("Prune removed %d accounts, want 1", n)
	}
	if _, ok := l.Account("k"); ok {
		t.Error("pruned account still there")
	}
}

func TestRefundSettlesToRunningTime(t *testing.T) {
	// Enqueue reserves a quantum; a run of 20 s then refunds 40 s: the key
	// pays exactly 20 s.
	l := share.NewLedger(share.Params{Quantum: time.Minute, HalfLife: -1})
	l.Enqueue("k", t0)
	l.Charge("k", 20*time.Second-l.Quantum(), t0)
	if got := l.Peek("k", t0); got != 20_000_000 {
		t.Errorf("finish = %d, want 20e6", got)
	}
}

func TestSaturates(t *testing.T) {
	l := share.NewLedger(share.Params{HalfLife: -1})
	l.SetShares("k", 1)
	for range 30 {
		l.Charge("k", time.Duration(math.MaxInt64), t0)
	}
	if got := l.Peek("k", t0); got != math.MaxUint64 {
		t.Errorf("finish = %d, want saturation at MaxUint64", got)
	}
}

func TestAccountProtoRoundTrip(t *testing.T) {
	l := share.NewLedger(share.Params{HalfLife: -1})
	l.Charge("db/_replicator", time.Minute, t0)
	a, ok := l.Account("db/_replicator")
	if !ok {
		t.Fatal("no account")
	}
	b, err := proto.Marshal(a.Proto("db/_replicator"))
	if err != nil {
		t.Fatal(err)
	}
	m := a.Proto("")
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
	key, back := share.AccountFromProto(m)
	if key != "db/_replicator" || back.Finish != a.Finish || !back.UpdatedAt.Equal(a.UpdatedAt) {
		t.Errorf("round trip: %q %+v, want %+v", key, back, a)
	}
	l2 := share.NewLedger(share.Params{HalfLife: -1})
	l2.Restore(key, back)
	if l2.Peek(key, t0) != l.Peek(key, t0) {
		t.Error("restored ledger disagrees")
	}
	if _, zero := share.AccountFromProto(nil); zero.Finish != 0 || !zero.UpdatedAt.IsZero() {
		t.Error("nil record is not the zero account")
	}
}

// TestTwoKeysConverge: two keys competing for one slot, served strictly in
// deadline order, split running time by their shares.
func TestTwoKeysConverge(t *testing.T) {
	tests := []struct {
		name   string
		sa, sb int
	}{{"equal", 100, 100}, {"2:1", 200, 100}, {"1:10", 50, 500}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := share.NewLedger(share.Params{Quantum: time.Second, HalfLife: -1})
			l.SetShares("a", tc.sa)
			l.SetShares("b", tc.sb)
			now := t0
			next := map[string]uint64{"a": l.Enqueue("a", now), "b": l.Enqueue("b", now)}
			ran := map[string]int{}
			for range 10000 {
				k := "a"
				if next["b"] < next["a"] {
					k = "b"
				}
				l.Accepted(next[k])
				now = now.Add(time.Second) // runs exactly its quantum
				ran[k]++
				next[k] = l.Enqueue(k, now)
			}
			got := float64(ran["a"]) / float64(ran["b"])
			want := float64(tc.sa) / float64(tc.sb)
			if math.Abs(got/want-1) > 0.01 {
				t.Errorf("a:b = %.4f, want %.4f", got, want)
			}
		})
	}
}

// TestFoldIsChargeAndEnqueueSummed: folding the summed Costs of a sequence
// of Charges and Enqueues (as the job store keeps them, in a counter of
// atomic adds) gives the account those Charges and Enqueues give one after
// another, at one frontier: the arithmetic of the shares is the same.
func TestFoldIsChargeAndEnqueueSummed(t *testing.T) {
	p := share.Params{Quantum: time.Minute, HalfLife: time.Hour}
	type op struct {
		enqueue bool
		ran     time.Duration
	}
	tests := []struct {
		name     string
		shares   int
		start    share.Account
		frontier uint64
		ops      []op
	}{
		{"charges", 100, share.Account{}, 0, []op{{ran: time.Second}, {ran: time.Minute}, {ran: 3 * time.Hour}}},
		{"enqueues and a refund", 50, share.Account{}, 0, []op{{enqueue: true}, {enqueue: true}, {ran: -time.Minute}}},
		{"a crash storm: enqueue, short run, enqueue", 200, share.Account{Finish: 5e9, UpdatedAt: t0},
			1e9, []op{{enqueue: true}, {ran: -59 * time.Second}, {enqueue: true}, {ran: -59 * time.Second}, {enqueue: true}}},
		{"at the frontier", 100, share.Account{Finish: 7e9, UpdatedAt: t0}, 7e9,
			[]op{{enqueue: true}, {ran: time.Minute}, {enqueue: true}}},
		{"decayed debt, then charged", 1000, share.Account{Finish: 9e12, UpdatedAt: t0.Add(-3 * time.Hour)}, 1e12,
			[]op{{ran: 10 * time.Minute}, {enqueue: true}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := t0
			seq, delta := tc.start, int64(0)
			for i, o := range tc.ops {
				if o.enqueue {
					var prio uint64
					seq, prio = seq.Enqueue(p, tc.shares, tc.frontier, now)
					delta += p.ReserveCost(tc.shares)
					if got := tc.start.Fold(p, tc.frontier, delta, now).Finish; got != prio {
						t.Errorf("op %d: priority %d, folded %d", i, prio, got)
					}
					continue
				}
				seq = seq.Charge(p, tc.shares, tc.frontier, o.ran, now)
				if o.ran < 0 {
					delta -= share.Cost(-o.ran, tc.shares)
				} else {
					delta += share.Cost(o.ran, tc.shares)
				}
			}
			if got := tc.start.Fold(p, tc.frontier, delta, now); got != seq {
				t.Errorf("folded %+v, one after another %+v", got, seq)
			}
		})
	}
}

// TestFoldFloorsTheSum: the frontier is the floor of the account with its
// charges summed, not of the account before them: reservations of a key
// whose jobs were accepted (the frontier rose to their deadlines) count
// once.
func TestFoldFloorsTheSum(t *testing.T) {
	p := share.Params{Quantum: time.Minute, HalfLife: -1}
	c := p.ReserveCost(100)
	tests := []struct {
		name     string
		start    share.Account
		frontier uint64
		delta    int64
		want     uint64
	}{
		{"three reserved jobs accepted", share.Account{}, uint64(3 * c), 3 * c, uint64(3 * c)},
		{"the frontier beyond them", share.Account{}, uint64(5 * c), 3 * c, uint64(5 * c)},
		{"below the frontier, charged beyond it", share.Account{Finish: 10}, 1000, 5000, 5010},
		{"a refund never below zero", share.Account{Finish: 10}, 0, -50, 0},
		{"nor below the frontier", share.Account{Finish: 5000}, 1000, -4500, 1000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.start.Fold(p, tc.frontier, tc.delta, t0).Finish; got != tc.want {
				t.Errorf("Fold = %d, want %d", got, tc.want)
			}
			// The lag is what the floor added.
			sum := int64(tc.start.Finish) + tc.delta
			wantLag := uint64(0)
			if sum < int64(tc.frontier) {
				wantLag = tc.frontier - uint64(max(sum, 0))
			}
			if got := tc.start.Lag(p, tc.frontier, tc.delta, t0); got != wantLag {
				t.Errorf("Lag = %d, want %d", got, wantLag)
			}
		})
	}
}
