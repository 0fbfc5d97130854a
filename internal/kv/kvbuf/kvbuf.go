// Package kvbuf is what the backends that hold a transaction's writes
// until its commit (sqlite, postgres) share of a transaction attempt:
//
//   - Buffer, the client-side write buffer: the final state of every key
//     written (set, cleared, an atomic add pending on the stored value, a
//     versionstamped value), the cleared ranges, the versionstamped keys,
//     and how a read merges them with the stored value (read-your-writes);
//   - Tx, the attempt's kv.Tx front over the backend's stored reads
//     (Store): the buffer, reads through it, the first internal error,
//     the versionstamp futures (StampFuture) resolved at commit;
//   - Iterator, a range read merging the stored rows, which the backend
//     fetches in pages (Rows), with the buffered writes, and narrowing the
//     read's conflict span (Span) to what the caller consumed;
//   - Retry, the Transact loop around a backend's attempt.
//
// The backends keep their snapshots, read sets, validation, watches and
// commits.
package kvbuf

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/couchrep/couchrep/internal/kv"
)

// Kind is what a transaction did last to a key.
type Kind uint8

// The kinds of buffered write.
const (
	Set    Kind = iota // Value is the new value
	Clear              // the key is removed
	Add                // Delta is added to the stored value at commit
	SetVSV             // Value with a versionstamp at VSOffset
)

// Op is the buffered final state of one key.
type Op struct {
	Kind     Kind
	Value    []byte
	Delta    int64
	VSOffset int
}

// Merge returns what a read of key sees: the op applied to base, the
// stored value (nil: absent).
func (o *Op) Merge(key, base []byte) ([]byte, error) {
	switch o.Kind {
	case Set:
		return slices.Clone(o.Value), nil
	case Clear:
		return nil, nil
	case Add:
		return kv.EncodeInt64LE(kv.Int64LE(base) + o.Delta), nil
	default:
		return nil, fmt.Errorf("%w: key %x", kv.ErrUnreadable, key)
	}
}

// Range is the key range [Begin, End).
type Range struct{ Begin, End []byte }

// Contains reports whether k lies in r.
func (r Range) Contains(k []byte) bool {
	return bytes.Compare(k, r.Begin) >= 0 && bytes.Compare(k, r.End) < 0
}

// VSKey is a write at a versionstamped key.
type VSKey struct {
	Key    []byte
	Offset int
	Value  []byte
}

// Buffer holds a transaction's writes. Its zero value is not usable; use
// New.
type Buffer struct {
	Writes map[string]*Op
	Clears []Range
	VSKeys []VSKey

	size kv.WriteCounter // bytes written, for kv.MaxTransactionSize
}

// New returns an empty buffer.
func New() Buffer { return Buffer{Writes: map[string]*Op{}} }

// NonNil returns b, or an empty slice for nil.
func NonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// check refuses a write beyond kv's size limits (the caller fails its
// transaction with the error) and counts its bytes.
func (b *Buffer) check(key, value []byte) error {
	if err := kv.CheckWrite(key, value); err != nil {
		return err
	}
	return b.size.Add(len(key) + len(value))
}

// Set buffers a write of value at key; an error (beyond kv's size limits)
// buffers nothing.
func (b *Buffer) Set(key, value []byte) error {
	if err := b.check(key, value); err != nil {
		return err
	}
	b.Writes[string(key)] = &Op{Kind: Set, Value: slices.Clone(NonNil(value))}
	return nil
}

// Clear buffers the removal of key.
func (b *Buffer) Clear(key []byte) error {
	if err := b.check(key, nil); err != nil {
		return err
	}
	b.Writes[string(key)] = &Op{Kind: Clear}
	return nil
}

// ClearRange buffers the removal of [begin, end), dropping the writes it
// covers.
func (b *Buffer) ClearRange(begin, end []byte) error {
	if err := b.size.Add(len(begin) + len(end)); err != nil {
		return err
	}
	if bytes.Compare(begin, end) >= 0 {
		return nil
	}
	r := Range{slices.Clone(NonNil(begin)), slices.Clone(end)}
	for k := range b.Writes {
		if r.Contains([]byte(k)) {
			delete(b.Writes, k)
		}
	}
	b.Clears = append(b.Clears, r)
	return nil
}

// Add buffers an atomic add of delta to key, folded into an earlier write
// of the same key; it fails on a key with a versionstamped value.
func (b *Buffer) Add(key []byte, delta int64) error {
	if err := b.check(key, make([]byte, 8)); err != nil {
		return err
	}
	o, ok := b.Writes[string(key)]
	switch {
	case !ok && b.Cleared(key), ok && o.Kind == Clear:
		b.Writes[string(key)] = &Op{Kind: Set, Value: kv.EncodeInt64LE(delta)}
	case !ok:
		b.Writes[string(key)] = &Op{Kind: Add, Delta: delta}
	case o.Kind == Set:
		o.Value = kv.EncodeInt64LE(kv.Int64LE(o.Value) + delta)
	case o.Kind == Add:
		o.Delta += delta
	default:
		return fmt.Errorf("%w: Add on key %x", kv.ErrUnreadable, key)
	}
	return nil
}

// SetVersionstampedKey buffers a write at a versionstamped key.
func (b *Buffer) SetVersionstampedKey(key []byte, offset int, value []byte) error {
	if offset < 0 || offset+kv.VersionstampLength > len(key) {
		return fmt.Errorf("%w: offset %d in a %d-byte key", kv.ErrInvalidVersionstamp, offset, len(key))
	}
	if err := b.check(key, value); err != nil {
		return err
	}
	b.VSKeys = append(b.VSKeys, VSKey{Key: slices.Clone(key), Offset: offset, Value: slices.Clone(NonNil(value))})
	return nil
}

// SetVersionstampedValue buffers a write of a versionstamped value.
func (b *Buffer) SetVersionstampedValue(key, value []byte, offset int) error {
	if offset < 0 || offset+kv.VersionstampLength > len(value) {
		return fmt.Errorf("%w: offset %d in a %d-byte value", kv.ErrInvalidVersionstamp, offset, len(value))
	}
	if err := b.check(key, value); err != nil {
		return err
	}
	b.Writes[string(key)] = &Op{Kind: SetVSV, Value: slices.Clone(value), VSOffset: offset}
	return nil
}

// Cleared reports whether a buffered ClearRange covers k.
func (b *Buffer) Cleared(k []byte) bool {
	for _, r := range b.Clears {
		if r.Contains(k) {
			return true
		}
	}
	return false
}

// HasWrites reports whether anything is buffered.
func (b *Buffer) HasWrites() bool {
	return len(b.Writes) > 0 || len(b.Clears) > 0 || len(b.VSKeys) > 0
}

// Keys returns the buffered keys in [begin, end), in order or reverse.
func (b *Buffer) Keys(begin, end []byte, reverse bool) []string {
	var ks []string
	r := Range{begin, end}
	for k := range b.Writes {
		if r.Contains([]byte(k)) {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	if reverse {
		slices.Reverse(ks)
	}
	return ks
}

// StampFuture is a kv.VersionstampFuture resolved at commit.
type StampFuture struct {
	done  chan struct{}
	stamp [kv.VersionstampLength]byte
	err   error
}

// NewStampFuture returns an unresolved future.
func NewStampFuture() *StampFuture { return &StampFuture{done: make(chan struct{})} }

// Resolve sets the future's result; later calls do nothing.
func (f *StampFuture) Resolve(s [kv.VersionstampLength]byte, err error) {
	select {
	case <-f.done:
		return
	default:
	}
	f.stamp, f.err = s, err
	close(f.done)
}

// Get implements kv.VersionstampFuture.
func (f *StampFuture) Get(ctx context.Context) ([kv.VersionstampLength]byte, error) {
	select {
	case <-f.done:
		return f.stamp, f.err
	case <-ctx.Done():
		return [kv.VersionstampLength]byte{}, ctx.Err()
	}
}
