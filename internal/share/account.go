package share

import (
	"math"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/messages"
)

// Shares bounds for [replicator.shares], as in CouchDB's couch_replicator_share
// (?DEFAULT_SHARES, ?MIN_SHARES, ?MAX_SHARES).
const (
	DefaultShares = 100
	MinShares     = 1
	MaxShares     = 1000
)

// Defaults for Params.
const (
	DefaultQuantum  = time.Minute
	DefaultHalfLife = 24 * time.Hour
)

// ClampShares returns n clamped to [MinShares, MaxShares], as CouchDB does
// with a configured value.
func ClampShares(n int) int {
	return min(max(n, MinShares), MaxShares)
}

// Key is the share key of a job, CouchDB's couch_replicator_share:key/1: the
// _replicator database name for jobs from documents, the user name for
// transient (_replicate) jobs.
func Key(dbName, user string) string {
	if dbName != "" {
		return dbName
	}
	return user
}

// Params are the fair-share tunables shared by every account.
type Params struct {
	// Quantum is the running time reserved for a job when it is enqueued
	// (normally how long a job runs before rotation stops it). It sets how far apart the
	// deadlines of one key's jobs enqueued together are; the actual running
	// time is settled by Charge. Zero means DefaultQuantum.
	Quantum time.Duration
	// HalfLife is the half-life of a key's debt above the frontier. Zero
	// means DefaultHalfLife; negative means debt never decays.
	HalfLife time.Duration
}

func (p Params) quantum() time.Duration {
	if p.Quantum <= 0 {
		return DefaultQuantum
	}
	return p.Quantum
}

func (p Params) halfLife() time.Duration {
	if p.HalfLife == 0 {
		return DefaultHalfLife
	}
	return p.HalfLife
}

// Account is one share key's fair-share state: its virtual finish time and
// when that was written. The zero Account is a key that never ran.
type Account struct {
	// Finish is the key's virtual finish time (virtual microseconds).
	Finish uint64
	// UpdatedAt is when Finish was last written; debt decays from here.
	UpdatedAt time.Time
}

// Effective is the account's finish time as of now: at least the frontier,
// with the debt above the frontier decayed by p.HalfLife since UpdatedAt.
func (a Account) Effective(p Params, frontier uint64, now time.Time) uint64 {
	if a.Finish <= frontier {
		return frontier
	}
	debt := a.Finish - frontier
	hl := p.halfLife()
	if hl > 0 && now.After(a.UpdatedAt) && !a.UpdatedAt.IsZero() {
		f := math.Exp2(-float64(now.Sub(a.UpdatedAt)) / float64(hl))
		debt = uint64(float64(debt) * f)
	}
	return frontier + debt
}

// cost is ran in virtual microseconds for a key with the given shares.
func cost(ran time.Duration, shares int) uint64 {
	if ran <= 0 {
		return 0
	}
	us := uint64(ran / time.Microsecond)
	shares = ClampShares(shares)
	hi, lo := mulDiv(us, DefaultShares, uint64(shares))
	if hi {
		return math.MaxUint64
	}
	return lo
}

// mulDiv returns a*b/c and whether it overflowed uint64.
func mulDiv(a, b, c uint64) (overflow bool, v uint64) {
	if a != 0 && b > math.MaxUint64/a {
		return true, 0
	}
	return false, a * b / c
}

func satAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// Charge returns the account after the key ran for ran (negative: a refund
// of reserved time that was not used) with the given shares.
func (a Account) Charge(p Params, shares int, frontier uint64, ran time.Duration, now time.Time) Account {
	f := a.Effective(p, frontier, now)
	if ran >= 0 {
		f = satAdd(f, cost(ran, shares))
	} else {
		c := cost(-ran, shares)
		if c > f {
			f = 0
		} else {
			f -= c
		}
	}
	return Account{Finish: f, UpdatedAt: now}
}

// Enqueue returns the account after one quantum was reserved for a job
// enqueued now, and the job's priority (its virtual deadline).
func (a Account) Enqueue(p Params, shares int, frontier uint64, now time.Time) (Account, uint64) {
	f := satAdd(a.Effective(p, frontier, now), cost(p.quantum(), shares))
	return Account{Finish: f, UpdatedAt: now}, f
}

// Cost is what running for ran costs a key with the given shares, in
// virtual microseconds: what Charge adds to its finish time (Enqueue adds
// Cost(p.Quantum)); saturated at MaxInt64, so that it fits a counter kept
// with atomic adds (Fold).
func Cost(ran time.Duration, shares int) int64 {
	c := cost(ran, shares)
	if c > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(c)
}

// ReserveCost is what Enqueue adds for one job of a key with the given
// shares: Cost of one quantum.
func (p Params) ReserveCost(shares int) int64 { return Cost(p.quantum(), shares) }

// Fold returns the account after delta virtual microseconds were charged
// (positive) or refunded (negative) since it was written: the sum of the
// Costs of Charges and Enqueues run one after another, kept in a counter of
// atomic adds so that concurrent job ends of one key do not conflict. The
// debt above the frontier decays as in Effective (once, for the account as
// written); the frontier is the floor of the sum, not of the account as
// written: the frontier rises as the key's own reserved jobs are accepted,
// and raising the account to it before adding those reservations would
// count them twice. So a sequence of Charges and Enqueues folded at once
// is those Charges and Enqueues one after another whenever none of them
// took the account below the frontier (a refund of more than it was
// ahead by is kept here, where Charge would forget it at the floor).
func (a Account) Fold(p Params, frontier uint64, delta int64, now time.Time) Account {
	return Account{Finish: max(a.sum(p, frontier, delta, now), frontier), UpdatedAt: now}
}

// Lag is how far the account with delta summed falls below the frontier
// (0 when it does not): time the key did not use while others ran, which
// Fold forgives but a counter of atomic adds does not forget. A caller
// keeping the charges in such a counter folds the account once the lag is
// more than a quantum's cost, so that a key never banks more than that.
func (a Account) Lag(p Params, frontier uint64, delta int64, now time.Time) uint64 {
	if f := a.sum(p, frontier, delta, now); f < frontier {
		return frontier - f
	}
	return 0
}

// sum is the account with delta added, the debt above the frontier
// decayed, not floored.
func (a Account) sum(p Params, frontier uint64, delta int64, now time.Time) uint64 {
	f := a.Finish
	if f > frontier {
		f = a.Effective(p, frontier, now)
	}
	switch {
	case delta >= 0:
		f = satAdd(f, uint64(delta))
	case uint64(-delta) > f:
		f = 0
	default:
		f -= uint64(-delta)
	}
	return f
}

// Proto is the account as the stored record of key.
func (a Account) Proto(key string) *messages.ShareAccount {
	m := &messages.ShareAccount{Key: key, Finish: a.Finish}
	if !a.UpdatedAt.IsZero() {
		m.UpdatedAt = timestamppb.New(a.UpdatedAt)
	}
	return m
}

// AccountFromProto is the key and account of a stored record.
func AccountFromProto(m *messages.ShareAccount) (string, Account) {
	a := Account{Finish: m.GetFinish()}
	if m.GetUpdatedAt() != nil {
		a.UpdatedAt = m.GetUpdatedAt().AsTime()
	}
	return m.GetKey(), a
}
