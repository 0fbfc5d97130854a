package kv

import (
	"errors"
	"fmt"
)

// Size limits. They are FoundationDB's ("Known Limitations": keys cannot
// exceed 10,000 bytes, values 100,000 bytes, a transaction 10,000,000 bytes
// of affected data), and every backend enforces them the same way, so that
// what commits on the embedded store also commits on a cluster: a layer
// that would write more must split its data or refuse its input.
const (
	// MaxKeySize is the largest key a transaction may write, in bytes.
	MaxKeySize = 10_000
	// MaxValueSize is the largest value a transaction may write, in bytes.
	MaxValueSize = 100_000
	// MaxTransactionSize bounds the bytes one transaction writes: the keys
	// and values of its sets (versionstamped ones included) and atomic
	// adds, the keys of its clears and both ends of its cleared ranges,
	// counted at every call. FoundationDB also counts the transaction's
	// read and write conflict ranges against its 10,000,000, so a
	// transaction near this bound may still be too large there.
	MaxTransactionSize = 10_000_000
)

// Errors of writes beyond the size limits. The write is not buffered and
// the transaction fails with the error (wrapped, naming the size): its
// commit is not attempted and Transact does not retry it.
var (
	ErrKeyTooLarge         = errors.New("kv: key too large")
	ErrValueTooLarge       = errors.New("kv: value too large")
	ErrTransactionTooLarge = errors.New("kv: transaction too large")
)

// CheckWrite returns an error wrapping ErrKeyTooLarge or ErrValueTooLarge
// if a write of value at key is beyond the limits (value nil for a clear
// or an add).
func CheckWrite(key, value []byte) error {
	if len(key) > MaxKeySize {
		return fmt.Errorf("%w: %d bytes (at most %d), key starting %x", ErrKeyTooLarge, len(key), MaxKeySize, key[:32])
	}
	if len(value) > MaxValueSize {
		return fmt.Errorf("%w: %d bytes (at most %d) at key %x", ErrValueTooLarge, len(value), MaxValueSize, key[:min(len(key), 200)])
	}
	return nil
}

// WriteCounter adds up the bytes a transaction writes, for
// MaxTransactionSize. Its zero value is ready.
type WriteCounter struct{ n int }

// Add counts n more bytes; it returns an error wrapping
// ErrTransactionTooLarge once the total exceeds MaxTransactionSize.
func (c *WriteCounter) Add(n int) error {
	c.n += n
	if c.n > MaxTransactionSize {
		return fmt.Errorf("%w: more than %d bytes written", ErrTransactionTooLarge, MaxTransactionSize)
	}
	return nil
}

// IsTooLarge reports whether err is a write beyond the size limits.
func IsTooLarge(err error) bool {
	return errors.Is(err, ErrKeyTooLarge) || errors.Is(err, ErrValueTooLarge) || errors.Is(err, ErrTransactionTooLarge)
}
