package tuple

import (
	"bytes"
	"fmt"
)

// Subspace is a key prefix: a raw byte prefix followed by a packed tuple.
// Keys in a subspace are the prefix followed by a packed tuple, so they sort
// by that tuple.
type Subspace struct {
	prefix []byte
}

// NewSubspace returns the subspace whose prefix is prefix followed by the
// packing of t.
func NewSubspace(prefix []byte, t Tuple) Subspace {
	b := append(append([]byte(nil), prefix...), t.Pack()...)
	return Subspace{prefix: b}
}

// Sub returns the subspace of s extended by elems.
func (s Subspace) Sub(elems ...any) Subspace {
	return NewSubspace(s.prefix, Tuple(elems))
}

// Pack returns the key of t in s.
func (s Subspace) Pack(t Tuple) []byte {
	return append(append(make([]byte, 0, len(s.prefix)+16), s.prefix...), t.Pack()...)
}

// PackWithVersionstamp returns the key of t in s, where t holds exactly one
// incomplete Versionstamp, and the offset of its transaction version.
func (s Subspace) PackWithVersionstamp(t Tuple) ([]byte, int, error) {
	return t.PackWithVersionstamp(s.prefix)
}

// Unpack decodes the tuple of key k, which must lie in s.
func (s Subspace) Unpack(k []byte) (Tuple, error) {
	if !s.Contains(k) {
		return nil, fmt.Errorf("%w: %x", ErrNotInSubspace, k)
	}
	return Unpack(k[len(s.prefix):])
}

// Range returns [begin, end) holding every key strictly inside s: the
// prefix followed by 0x00 up to the prefix followed by 0xff.
func (s Subspace) Range() (begin, end []byte) {
	begin = append(append(make([]byte, 0, len(s.prefix)+1), s.prefix...), 0x00)
	end = append(append(make([]byte, 0, len(s.prefix)+1), s.prefix...), 0xff)
	return begin, end
}

// Bytes returns a copy of the subspace's prefix.
func (s Subspace) Bytes() []byte { return append([]byte(nil), s.prefix...) }

// Contains reports whether k starts with the subspace's prefix.
func (s Subspace) Contains(k []byte) bool { return bytes.HasPrefix(k, s.prefix) }
