package kv

import (
	"encoding/binary"
	"errors"
)

// ErrUnreadable is returned by a read of a key whose value this transaction
// set with SetVersionstampedValue: its bytes are only known at commit.
var ErrUnreadable = errors.New("kv: value has a pending versionstamp")

// Int64LE decodes a counter maintained with Tx.Add: a little-endian signed
// 64-bit integer. Shorter values are zero-extended and longer ones truncated,
// the way FDB's atomic ADD treats an existing value; nil decodes as 0.
func Int64LE(b []byte) int64 {
	var s [8]byte
	copy(s[:], b)
	return int64(binary.LittleEndian.Uint64(s[:]))
}

// EncodeInt64LE encodes v the way Tx.Add stores counters, for callers that
// Set a counter's initial value.
func EncodeInt64LE(v int64) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, uint64(v))
	return b
}

// ErrWatchCancelled is returned by Watch.Wait after Watch.Cancel.
var ErrWatchCancelled = errors.New("kv: watch cancelled")
