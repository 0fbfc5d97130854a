package repjob

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
	"github.com/couchrep/couchrep/internal/share"
	"github.com/couchrep/couchrep/messages"
)

// Key-space tags (see the package comment).
const (
	tagRepIDs       = 1
	tagShares       = 2
	tagFrontier     = 3
	tagChanges      = 4
	tagLastChange   = 5
	tagChangesWatch = 6
	tagExpire       = 7
	tagControl      = 8
	tagControlWatch = 9
	// tagShareCharges is 15: 10-14 are the listing's (listing.go).
	tagShareCharges = 15
)

type keys struct {
	repIDs, shares, charges, changes, lastChange, expire, control, controlWatch tuple.Subspace
	sched, docs, listed, counts                                                 tuple.Subspace
	frontier, changesWatch, listingBuilt                                        []byte
}

func newKeys(prefix []byte) keys {
	root := tuple.NewSubspace(prefix, tuple.Tuple{"repjob"})
	return keys{
		repIDs:       root.Sub(tagRepIDs),
		shares:       root.Sub(tagShares),
		charges:      root.Sub(tagShareCharges),
		changes:      root.Sub(tagChanges),
		lastChange:   root.Sub(tagLastChange),
		expire:       root.Sub(tagExpire),
		control:      root.Sub(tagControl),
		controlWatch: root.Sub(tagControlWatch),
		frontier:     root.Pack(tuple.Tuple{tagFrontier}),
		changesWatch: root.Pack(tuple.Tuple{tagChangesWatch}),
		sched:        root.Sub(tagSched),
		docs:         root.Sub(tagDocs),
		listed:       root.Sub(tagListed),
		counts:       root.Sub(tagCount),
		listingBuilt: root.Pack(tuple.Tuple{tagListingBuilt}),
	}
}

func (k keys) count(name string) []byte { return k.counts.Pack(tuple.Tuple{name}) }

func (k keys) repIDKey(repID string) []byte { return k.repIDs.Pack(tuple.Tuple{repID}) }
func (k keys) shareKey(key string) []byte   { return k.shares.Pack(tuple.Tuple{key}) }
func (k keys) chargesKey(key string) []byte { return k.charges.Pack(tuple.Tuple{key}) }
func (k keys) lastChangeKey(id string) []byte {
	return k.lastChange.Pack(tuple.Tuple{id})
}
func (k keys) controlKey(node, id string) []byte { return k.control.Pack(tuple.Tuple{node, id}) }
func (k keys) controlWatchKey(node string) []byte {
	return k.controlWatch.Pack(tuple.Tuple{node})
}
func (k keys) expireKey(at time.Time, id string) []byte {
	return k.expire.Pack(tuple.Tuple{at.UnixNano(), id})
}

// ledger is the fair-share state of one transaction: accounts and the
// frontier read from the store, written back as they change.
type ledger struct {
	s  *Store
	tx kv.Tx
	p  share.Params
}

func (s *Store) ledger(tx kv.Tx) ledger { return ledger{s: s, tx: tx, p: s.shareParams()} }

func (l ledger) frontier() (uint64, error) {
	b, err := l.tx.Get(l.s.k.frontier)
	if err != nil || len(b) != 8 {
		return 0, err
	}
	return binary.BigEndian.Uint64(b), nil
}

// frontierFloor reads the frontier as a floor for an account's virtual
// time, without a read conflict: every Start raises the frontier, so a
// conflicting read would abort every add (and a doc processor's batch of
// hundreds) that overlaps any node's accept. A frontier a few starts old
// only lets the account's next deadline fall as much earlier.
func (l ledger) frontierFloor() (uint64, error) {
	b, err := l.tx.Snapshot().Get(l.s.k.frontier)
	if err != nil || len(b) != 8 {
		return 0, err
	}
	return binary.BigEndian.Uint64(b), nil
}

// accepted raises the frontier to at least prio. A frontier already there
// (read without a conflict: every write of it is under one, so it only
// grows) needs no write and adds no conflict: the Starts of a batch of
// accepted jobs each read it with a conflict, and each that raised it
// aborted the others, which read it again with a conflict and aborted
// again (541 jobs accepted at once started at 4-5 a second); now a Start
// aborted by a higher frontier finds it high enough on its next attempt.
func (l ledger) accepted(prio uint64) error {
	if f, err := l.frontierFloor(); err != nil || f >= prio {
		return err
	}
	f, err := l.frontier()
	if err != nil {
		return err
	}
	if prio > f {
		l.tx.Set(l.s.k.frontier, binary.BigEndian.AppendUint64(nil, prio))
	}
	return nil
}

// foldEvery is how old an account's stored record gets before an enqueue
// folds the charges summed since into it (ledger.enqueue).
const foldEvery = time.Minute

// account reads key's stored account and the virtual time charged to it
// since (the CHARGES counter), both without a read conflict unless
// conflict: a job end or enqueue of the key in a transaction of its own
// never aborts another.
func (l ledger) account(key string, conflict bool) (share.Account, int64, error) {
	snap := l.tx.Snapshot()
	get := snap.Get
	if conflict {
		get = l.tx.Get
	}
	b, err := get(l.s.k.shareKey(key))
	if err != nil {
		return share.Account{}, 0, err
	}
	var a share.Account
	if b != nil {
		m := &messages.ShareAccount{}
		if err := proto.Unmarshal(b, m); err != nil {
			return share.Account{}, 0, fmt.Errorf("repjob: decode share account %q: %w", key, err)
		}
		_, a = share.AccountFromProto(m)
	}
	d, err := snap.Get(l.s.k.chargesKey(key))
	if err != nil {
		return share.Account{}, 0, err
	}
	return a, kv.Int64LE(d), nil
}

func (l ledger) put(key string, a share.Account) error {
	b, err := proto.Marshal(a.Proto(key))
	if err != nil {
		return fmt.Errorf("repjob: encode share account %q: %w", key, err)
	}
	l.tx.Set(l.s.k.shareKey(key), b)
	return nil
}

// enqueue reserves a quantum for a job of key and returns its priority:
// the account's finish time with the charges since folded in
// (share.Account.Fold), plus the quantum. The reservation is an atomic
// add to the key's CHARGES counter, so that the job ends of one
// _replicator database (hundreds a second in a crash storm: each crash
// charges its run and enqueues the job again) do not abort each other on
// its account. Jobs of one key enqueued at once may get the same
// deadline. Once the stored account is foldEvery old, or more than a
// quantum behind the frontier, the enqueue folds the counter into it: that write conflicts with another fold only (its
// read of the account is a conflicting one), and moves the counter down by
// what it folded, keeping the adds that commit meanwhile.
func (l ledger) enqueue(key string, now time.Time) (uint64, error) {
	f, err := l.frontierFloor()
	if err != nil {
		return 0, err
	}
	a, d, err := l.account(key, false)
	if err != nil {
		return 0, err
	}
	c := l.p.ReserveCost(l.s.sharesOf(key))
	// Folded when a minute old, or when it fell more than a quantum
	// behind the frontier: the counter would keep that lag as credit
	// (share.Account.Lag). A key refunding a crashed run's unused quantum
	// stays within one; one idle for long gets folded once.
	if now.Sub(a.UpdatedAt) >= foldEvery || a.Lag(l.p, f, d, now) > uint64(c) {
		// Read again, the account with a conflict (before the counter:
		// a fold committed in between aborts this one).
		if a, d, err = l.account(key, true); err != nil {
			return 0, err
		}
		a = a.Fold(l.p, f, d, now)
		if err := l.put(key, a); err != nil {
			return 0, err
		}
		if d != 0 {
			l.tx.Add(l.s.k.chargesKey(key), -d)
		}
		d = 0
	}
	l.tx.Add(l.s.k.chargesKey(key), c)
	return satAdd(a.Fold(l.p, f, d, now).Finish, uint64(c)), nil
}

func satAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// charge records that a job of key ran for ran beyond its reserved quantum
// (negative: a refund): an atomic add to the key's CHARGES counter, folded
// into its account by a later enqueue (no read, no conflict).
func (l ledger) charge(key string, ran time.Duration, now time.Time) error {
	switch {
	case ran > 0:
		l.tx.Add(l.s.k.chargesKey(key), share.Cost(ran, l.s.sharesOf(key)))
	case ran < 0:
		l.tx.Add(l.s.k.chargesKey(key), -share.Cost(-ran, l.s.sharesOf(key)))
	}
	return nil
}

// chargeRun settles a run that started at started: the first quantum was
// paid at enqueue.
func (l ledger) chargeRun(key string, started, now time.Time) error {
	if started.IsZero() {
		return nil
	}
	return l.charge(key, now.Sub(started)-l.p.Quantum, now)
}

// frontierTx reads the shared fair-share frontier (the highest priority
// accepted so far).
func (s *Store) frontierTx(tx kv.ReadTx) (uint64, error) {
	b, err := tx.Get(s.k.frontier)
	if err != nil || len(b) != 8 {
		return 0, err
	}
	return binary.BigEndian.Uint64(b), nil
}

// noteChange records that job id changed state in this transaction: its
// previous entry in the changes index is replaced by one at this
// transaction's versionstamp.
//
// It also brings the job's listing entries up to date (relist; known as
// there).
func (s *Store) noteChange(tx kv.Tx, id string, known *Record) error {
	lk := s.k.lastChangeKey(id)
	old, err := tx.Get(lk)
	if err != nil {
		return err
	}
	if len(old) == kv.VersionstampLength {
		var vs tuple.Versionstamp
		copy(vs.TransactionVersion[:], old)
		tx.Clear(s.k.changes.Pack(tuple.Tuple{vs, id}))
	}
	key, off, err := s.k.changes.PackWithVersionstamp(tuple.Tuple{tuple.IncompleteVersionstamp(0), id})
	if err != nil {
		return fmt.Errorf("repjob: changes key: %w", err)
	}
	if err := tx.SetVersionstampedKey(key, off, nil); err != nil {
		return err
	}
	if err := tx.SetVersionstampedValue(lk, make([]byte, kv.VersionstampLength), 0); err != nil {
		return err
	}
	tx.Add(s.k.changesWatch, 1)
	return s.relist(tx, id, known)
}

// ShareAccount is key's fair-share account as of now: its stored record
// with the charges since folded in (share.Account.Fold), as the next
// enqueue of a job of key sees it; read only.
func (s *Store) ShareAccount(ctx context.Context, key string) (share.Account, error) {
	if err := s.Init(ctx); err != nil {
		return share.Account{}, err
	}
	var a share.Account
	err := s.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		f, err := s.frontierTx(tx)
		if err != nil {
			return err
		}
		b, err := tx.Get(s.k.shareKey(key))
		if err != nil {
			return err
		}
		a = share.Account{}
		if b != nil {
			m := &messages.ShareAccount{}
			if err := proto.Unmarshal(b, m); err != nil {
				return fmt.Errorf("repjob: decode share account %q: %w", key, err)
			}
			_, a = share.AccountFromProto(m)
		}
		d, err := tx.Get(s.k.chargesKey(key))
		if err != nil {
			return err
		}
		a = a.Fold(s.shareParams(), f, kv.Int64LE(d), s.now())
		return nil
	})
	if err != nil {
		return share.Account{}, fmt.Errorf("repjob: read share account %q: %w", key, err)
	}
	return a, nil
}
