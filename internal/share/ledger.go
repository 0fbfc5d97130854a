package share

import "time"

// Ledger is the fair-share book of a node (or, when its accounts live in the
// shared store, of the cluster): shares and accounts per key and the queue's
// frontier. Every method is O(1) except Prune. A Ledger is not safe for
// concurrent use.
type Ledger struct {
	params   Params
	shares   map[string]int
	accounts map[string]Account
	frontier uint64
}

// NewLedger returns an empty ledger with every key at DefaultShares.
func NewLedger(p Params) *Ledger {
	return &Ledger{
		params:   p,
		shares:   make(map[string]int),
		accounts: make(map[string]Account),
	}
}

// Params are the ledger's tunables.
func (l *Ledger) Params() Params { return l.params }

// SetShares sets key's shares, clamped to [MinShares, MaxShares], and
// returns the value kept. It takes effect for later charges and enqueues.
func (l *Ledger) SetShares(key string, n int) int {
	n = ClampShares(n)
	if n == DefaultShares {
		delete(l.shares, key)
	} else {
		l.shares[key] = n
	}
	return n
}

// ResetShares puts key back to DefaultShares (a deleted config key).
func (l *Ledger) ResetShares(key string) { delete(l.shares, key) }

// Shares returns key's shares.
func (l *Ledger) Shares(key string) int {
	if n, ok := l.shares[key]; ok {
		return n
	}
	return DefaultShares
}

// Enqueue reserves one quantum for a job of key enqueued now and returns the
// priority to give it in the queue (its virtual deadline).
func (l *Ledger) Enqueue(key string, now time.Time) uint64 {
	a, p := l.accounts[key].Enqueue(l.params, l.Shares(key), l.frontier, now)
	l.accounts[key] = a
	return p
}

// Charge records that a job of key ran for ran beyond what was already
// reserved or charged for it; a negative ran refunds reserved time that the
// job did not use.
func (l *Ledger) Charge(key string, ran time.Duration, now time.Time) {
	if ran == 0 {
		return
	}
	l.accounts[key] = l.accounts[key].Charge(l.params, l.Shares(key), l.frontier, ran, now)
}

// Peek returns key's effective finish time now without reserving anything:
// the higher, the more the key is ahead of its share. The scheduler stops
// jobs of the keys with the highest Peek first.
func (l *Ledger) Peek(key string, now time.Time) uint64 {
	return l.accounts[key].Effective(l.params, l.frontier, now)
}

// Debt returns how far key is ahead of the frontier now, as running time at
// DefaultShares.
func (l *Ledger) Debt(key string, now time.Time) time.Duration {
	d := l.Peek(key, now) - l.frontier
	return time.Duration(min(d, uint64(1<<63-1)/uint64(time.Microsecond))) * time.Microsecond
}

// Accepted records that a job with the given priority was accepted from the
// queue: the frontier becomes at least priority.
func (l *Ledger) Accepted(priority uint64) {
	l.frontier = max(l.frontier, priority)
}

// Frontier returns the highest priority accepted so far.
func (l *Ledger) Frontier() uint64 { return l.frontier }

// Account returns key's stored state, for the caller to persist.
func (l *Ledger) Account(key string) (Account, bool) {
	a, ok := l.accounts[key]
	return a, ok
}

// Restore replaces key's state with one read from storage.
func (l *Ledger) Restore(key string, a Account) { l.accounts[key] = a }

// Prune forgets the accounts that have no debt left (their finish time is
// at or behind the frontier), which are indistinguishable from new ones,
// and returns how many it removed. It is O(accounts).
func (l *Ledger) Prune(now time.Time) int {
	n := 0
	for k, a := range l.accounts {
		if a.Effective(l.params, l.frontier, now) <= l.frontier {
			delete(l.accounts, k)
			n++
		}
	}
	return n
}

// Quantum is the running time Enqueue reserves per job; the scheduler
// charges a run only for the time beyond it (and refunds the rest).
func (l *Ledger) Quantum() time.Duration { return l.params.quantum() }
