package kvbuf

import (
	"context"
	"fmt"

	"github.com/couchrep/couchrep/internal/kv"
)

// Store is the backend's side of a Tx: reads of the stored state on the
// attempt's snapshot.
type Store interface {
	// ReadStored reads key from the snapshot, recording it in the read
	// set unless snapshot.
	ReadStored(key []byte, snapshot bool) ([]byte, error)
	// ReadRange returns an Iterator over [begin, end), recorded in the
	// read set unless snapshot.
	ReadRange(begin, end []byte, opts kv.RangeOptions, snapshot bool) kv.RangeIterator
}

// Tx is what the buffering backends' transaction attempts share: the
// buffered writes, read-your-writes over the backend's Store, the first
// internal error, and the versionstamp futures. A backend's attempt
// embeds it (initialised by Init) and adds its reads, read conflicts,
// watches and commit.
type Tx struct {
	Buf    Buffer
	Err    error // the first internal error; fails the commit
	Done   bool  // the attempt is finished: every use fails with kv.ErrTxDone
	Stamps []*StampFuture

	store Store
}

// Init readies t, whose stored reads are s's.
func (t *Tx) Init(s Store) {
	t.Buf = New()
	t.store = s
}

// Fail records err (nil: nothing) as the attempt's error unless one is
// recorded already.
func (t *Tx) Fail(err error) {
	if t.Err == nil {
		t.Err = err
	}
}

// FailSize fails the attempt with err if it is a write beyond kv's size
// limits (other errors leave it usable), and returns err.
func (t *Tx) FailSize(err error) error {
	if kv.IsTooLarge(err) {
		t.Fail(err)
	}
	return err
}

// Writable reports whether a write may be buffered, failing the attempt
// if it is finished.
func (t *Tx) Writable() bool {
	if t.Done {
		t.Fail(kv.ErrTxDone)
		return false
	}
	return true
}

// Result returns err (what the transaction's function returned) or else
// the attempt's error.
func (t *Tx) Result(err error) error {
	if err != nil {
		return err
	}
	return t.Err
}

// Finish marks the attempt done; with err, its stamps fail with err.
func (t *Tx) Finish(err error) {
	t.Done = true
	if err == nil {
		return
	}
	for _, f := range t.Stamps {
		f.Resolve([kv.VersionstampLength]byte{}, err)
	}
}

// Resolve resolves the stamps of a committed attempt.
func (t *Tx) Resolve(stamp [kv.VersionstampLength]byte) {
	for _, f := range t.Stamps {
		f.Resolve(stamp, nil)
	}
}

// HasWrites reports whether a commit has anything to write (or a
// versionstamp to give).
func (t *Tx) HasWrites() bool { return t.Buf.HasWrites() || len(t.Stamps) > 0 }

// Get implements kv.ReadTx.
func (t *Tx) Get(key []byte) ([]byte, error) { return t.Read(key, false) }

// Read returns what the attempt sees at key: the buffered write merged
// with the stored value, read (recorded unless snapshot) only when needed.
func (t *Tx) Read(key []byte, snapshot bool) ([]byte, error) {
	if t.Done {
		return nil, kv.ErrTxDone
	}
	if o, ok := t.Buf.Writes[string(key)]; ok {
		var base []byte
		if o.Kind == Add {
			var err error
			if base, err = t.store.ReadStored(key, snapshot); err != nil {
				return nil, err
			}
		}
		return o.Merge(key, base)
	}
	if t.Buf.Cleared(key) {
		return nil, nil
	}
	return t.store.ReadStored(key, snapshot)
}

// GetRange implements kv.ReadTx.
func (t *Tx) GetRange(begin, end []byte, opts kv.RangeOptions) kv.RangeIterator {
	return t.store.ReadRange(begin, end, opts, false)
}

// Snapshot implements kv.ReadTx.
func (t *Tx) Snapshot() kv.ReadTx { return snapshotTx{t} }

type snapshotTx struct{ t *Tx }

func (s snapshotTx) Get(key []byte) ([]byte, error) { return s.t.Read(key, true) }
func (s snapshotTx) GetRange(begin, end []byte, opts kv.RangeOptions) kv.RangeIterator {
	return s.t.store.ReadRange(begin, end, opts, true)
}
func (s snapshotTx) Snapshot() kv.ReadTx { return s }

// Set implements kv.Tx.
func (t *Tx) Set(key, value []byte) {
	if t.Writable() {
		t.Fail(t.Buf.Set(key, value))
	}
}

// Clear implements kv.Tx.
func (t *Tx) Clear(key []byte) {
	if t.Writable() {
		t.Fail(t.Buf.Clear(key))
	}
}

// ClearRange implements kv.Tx.
func (t *Tx) ClearRange(begin, end []byte) {
	if t.Writable() {
		t.Fail(t.Buf.ClearRange(begin, end))
	}
}

// Add implements kv.Tx: the delta is applied at commit, without reading
// the key into the read set.
func (t *Tx) Add(key []byte, delta int64) {
	if t.Writable() {
		t.Fail(t.Buf.Add(key, delta))
	}
}

// SetVersionstampedKey implements kv.Tx.
func (t *Tx) SetVersionstampedKey(key []byte, offset int, value []byte) error {
	if t.Done {
		return kv.ErrTxDone
	}
	return t.FailSize(t.Buf.SetVersionstampedKey(key, offset, value))
}

// SetVersionstampedValue implements kv.Tx.
func (t *Tx) SetVersionstampedValue(key, value []byte, offset int) error {
	if t.Done {
		return kv.ErrTxDone
	}
	return t.FailSize(t.Buf.SetVersionstampedValue(key, value, offset))
}

// Versionstamp implements kv.Tx.
func (t *Tx) Versionstamp() kv.VersionstampFuture {
	f := NewStampFuture()
	if t.Done {
		f.Resolve([kv.VersionstampLength]byte{}, kv.ErrTxDone)
		return f
	}
	t.Stamps = append(t.Stamps, f)
	return f
}

// Usable returns why a transaction may not start now: ctx's end or
// kv.ErrClosed (closed: the database is closed); nil when it may.
func Usable(ctx context.Context, closed bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if closed {
		return kv.ErrClosed
	}
	return nil
}

// Outcome is how an attempt of Retry ended.
type Outcome int

// The outcomes of an attempt.
const (
	Stop     Outcome = iota // Retry returns the attempt's error (nil: committed)
	Again                   // run again after kv.RetryBackoff
	AgainNow                // run again at once
)

// Retry is a backend's Transact loop: it runs attempt (given how many ran
// before) until it stops, ctx ends, the database is closed (closed), or
// maxAttempts ran; then the error says that backend gave up and wraps the
// last attempt's.
func Retry(ctx context.Context, backend string, maxAttempts int, closed func() bool, attempt func(n int) (Outcome, error)) error {
	var last error
	for n := 0; n < maxAttempts; n++ {
		if err := Usable(ctx, closed()); err != nil {
			return err
		}
		o, err := attempt(n)
		if o == Stop {
			return err
		}
		last = err
		if o == Again {
			if err := kv.RetryBackoff(ctx, n); err != nil {
				return err
			}
		}
	}
	return fmt.Errorf("%s: gave up after %d attempts: %w", backend, maxAttempts, last)
}
