// Package tuple implements FoundationDB's tuple encoding: an order-preserving
// byte encoding of typed tuples, producing exactly the bytes that the FDB
// tuple layer (design/tuple.md in apple/foundationdb) writes, so that keys
// built here sort the same way and can be read by any FDB binding.
//
// Packed tuples compare, byte by byte, in the same order as the tuples they
// encode compare element by element: integers numerically, strings and byte
// strings lexicographically, and a tuple sorts before any tuple it is a
// prefix of. That makes tuples the natural key schema for internal/kv: a
// Subspace is a key prefix (a raw prefix plus a packed tuple) and
// Subspace.Range returns the key range holding every tuple that extends it.
//
// Supported element types (and what Unpack returns for them):
//
//	nil                                  nil
//	[]byte                               []byte
//	string                               string
//	int, int8..int64, uint, uint8..uint64 int64 (uint64 above MaxInt64 stays uint64)
//	float32                              float32
//	float64                              float64
//	bool                                 bool
//	UUID                                 UUID
//	Versionstamp                         Versionstamp
//	Tuple (nested)                       Tuple
//
// Pack panics on an element of any other type, like the FDB Go binding;
// callers building tuples from untrusted input should use PackChecked.
package tuple

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Type codes of design/tuple.md.
const (
	nullCode         = 0x00
	bytesCode        = 0x01
	stringCode       = 0x02
	nestedCode       = 0x05
	negIntStart      = 0x0c
	intZeroCode      = 0x14
	posIntEnd        = 0x1c
	floatCode        = 0x20
	doubleCode       = 0x21
	falseCode        = 0x26
	trueCode         = 0x27
	uuidCode         = 0x30
	versionstampCode = 0x33
)

// Sentinel errors.
var (
	// ErrInvalidEncoding is returned (wrapped) by Unpack for bytes that are
	// not a valid tuple encoding.
	ErrInvalidEncoding = errors.New("tuple: invalid encoding")
	// ErrUnsupportedType is returned (wrapped) by PackChecked for an element
	// of a type the encoding does not support.
	ErrUnsupportedType = errors.New("tuple: unsupported element type")
	// ErrVersionstamp is returned by PackWithVersionstamp when the tuple does
	// not hold exactly one incomplete Versionstamp.
	ErrVersionstamp = errors.New("tuple: need exactly one incomplete versionstamp")
	// ErrNotInSubspace is returned (wrapped) by Subspace.Unpack for a key
	// outside the subspace.
	ErrNotInSubspace = errors.New("tuple: key not in subspace")
)

// Tuple is an ordered list of elements; see the package comment for the
// element types.
type Tuple []any

// UUID is an RFC 4122 UUID, encoded in network byte order.
type UUID [16]byte

// String formats u in the canonical 8-4-4-4-12 hex form.
func (u UUID) String() string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// Versionstamp is FDB's 96-bit versionstamp: the 10-byte transaction
// version assigned at commit (8 bytes of commit version, 2 of batch order)
// and a 2-byte user version that orders several stamps written by one
// transaction.
type Versionstamp struct {
	TransactionVersion [10]byte
	UserVersion        uint16
}

var incompleteTxVersion = [10]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// IncompleteVersionstamp returns a placeholder versionstamp whose
// transaction version is filled in at commit (see PackWithVersionstamp).
func IncompleteVersionstamp(userVersion uint16) Versionstamp {
	return Versionstamp{TransactionVersion: incompleteTxVersion, UserVersion: userVersion}
}

// IsComplete reports whether the transaction version has been assigned.
func (v Versionstamp) IsComplete() bool { return v.TransactionVersion != incompleteTxVersion }

// Bytes returns the 12-byte encoding (transaction version, then the user
// version big-endian).
func (v Versionstamp) Bytes() []byte {
	b := make([]byte, 12)
	copy(b, v.TransactionVersion[:])
	binary.BigEndian.PutUint16(b[10:], v.UserVersion)
	return b
}

// Pack encodes t. It panics if an element has an unsupported type (a
// programming error, as in the FDB binding); use PackChecked to get an error.
func (t Tuple) Pack() []byte {
	b, err := t.PackChecked()
	if err != nil {
		panic(err)
	}
	return b
}

// PackChecked encodes t, returning ErrUnsupportedType (wrapped) instead of
// panicking on an element it cannot encode.
func (t Tuple) PackChecked() ([]byte, error) {
	p := packer{}
	if err := p.tuple(t, false); err != nil {
		return nil, err
	}
	return p.buf, nil
}

// PackWithVersionstamp encodes prefix followed by t, which must contain
// exactly one incomplete Versionstamp (possibly inside a nested tuple). It
// returns the key and the offset of the 10-byte transaction version inside
// it, ready for kv.Tx.SetVersionstampedKey.
func (t Tuple) PackWithVersionstamp(prefix []byte) ([]byte, int, error) {
	p := packer{buf: append([]byte(nil), prefix...), vsOffset: -1}
	if err := p.tuple(t, false); err != nil {
		return nil, 0, err
	}
	if p.vsCount != 1 {
		return nil, 0, fmt.Errorf("%w: found %d", ErrVersionstamp, p.vsCount)
	}
	return p.buf, p.vsOffset, nil
}

// HasIncompleteVersionstamp reports whether t holds an incomplete
// Versionstamp anywhere, including in nested tuples.
func (t Tuple) HasIncompleteVersionstamp() bool {
	for _, e := range t {
		switch v := e.(type) {
		case Versionstamp:
			if !v.IsComplete() {
				return true
			}
		case Tuple:
			if v.HasIncompleteVersionstamp() {
				return true
			}
		}
	}
	return false
}

type packer struct {
	buf      []byte
	vsOffset int
	vsCount  int
}

// escaped appends code, b with every 0x00 escaped as 0x00 0xff, and 0x00.
func (p *packer) escaped(code byte, b []byte) {
	p.buf = append(p.buf, code)
	for {
		i := bytes.IndexByte(b, 0)
		if i < 0 {
			break
		}
		p.buf = append(p.buf, b[:i+1]...)
		p.buf = append(p.buf, 0xff)
		b = b[i+1:]
	}
	p.buf = append(p.buf, b...)
	p.buf = append(p.buf, 0)
}

func (p *packer) int(i int64) {
	if i >= 0 {
		p.uint(uint64(i))
		return
	}
	u := uint64(-i) // correct for MinInt64 too: 1<<63
	n := byteLen(u)
	p.buf = append(p.buf, byte(intZeroCode-n))
	// One's complement of the magnitude in n bytes.
	p.bigEndian(^u, n)
}

func (p *packer) uint(u uint64) {
	if u == 0 {
		p.buf = append(p.buf, intZeroCode)
		return
	}
	n := byteLen(u)
	p.buf = append(p.buf, byte(intZeroCode+n))
	p.bigEndian(u, n)
}

// float appends code and the n-byte IEEE bits of a float in sorting order
// (see floatOrder).
func (p *packer) float(code byte, bits uint64, n int) {
	p.buf = append(p.buf, code)
	p.bigEndian(floatOrder(bits, n, false), n)
}

// bigEndian appends the low n bytes of u, most significant first.
func (p *packer) bigEndian(u uint64, n int) {
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], u)
	p.buf = append(p.buf, s[8-n:]...)
}

func byteLen(u uint64) int {
	n := 0
	for u != 0 {
		n++
		u >>= 8
	}
	return n
}

// floatOrder transforms the n-byte IEEE bits of a float so that they sort as
// the numbers do: a negative number gets every bit flipped, any other only
// its sign bit. With stored, bits are transformed ones and are turned back
// (a stored negative number has its sign bit clear).
func floatOrder(bits uint64, n int, stored bool) uint64 {
	sign := uint64(1) << (8*n - 1)
	if negative := (bits&sign != 0) != stored; negative {
		return ^bits & byteMask(n)
	}
	return bits ^ sign
}

func (p *packer) tuple(t Tuple, nested bool) error {
	for _, e := range t {
		switch v := e.(type) {
		case nil:
			if nested {
				p.buf = append(p.buf, nullCode, 0xff)
			} else {
				p.buf = append(p.buf, nullCode)
			}
		case []byte:
			p.escaped(bytesCode, v)
		case string:
			p.escaped(stringCode, []byte(v))
		case int:
			p.int(int64(v))
		case int8:
			p.int(int64(v))
		case int16:
			p.int(int64(v))
		case int32:
			p.int(int64(v))
		case int64:
			p.int(v)
		case uint:
			p.uint(uint64(v))
		case uint8:
			p.uint(uint64(v))
		case uint16:
			p.uint(uint64(v))
		case uint32:
			p.uint(uint64(v))
		case uint64:
			p.uint(v)
		case float32:
			p.float(floatCode, uint64(math.Float32bits(v)), 4)
		case float64:
			p.float(doubleCode, math.Float64bits(v), 8)
		case bool:
			if v {
				p.buf = append(p.buf, trueCode)
			} else {
				p.buf = append(p.buf, falseCode)
			}
		case UUID:
			p.buf = append(p.buf, uuidCode)
			p.buf = append(p.buf, v[:]...)
		case Versionstamp:
			p.buf = append(p.buf, versionstampCode)
			if !v.IsComplete() {
				p.vsCount++
				p.vsOffset = len(p.buf)
			}
			p.buf = append(p.buf, v.Bytes()...)
		case Tuple:
			p.buf = append(p.buf, nestedCode)
			if err := p.tuple(v, true); err != nil {
				return err
			}
			p.buf = append(p.buf, 0x00)
		default:
			return fmt.Errorf("%w: %T", ErrUnsupportedType, e)
		}
	}
	return nil
}

// Unpack decodes a packed tuple.
func Unpack(b []byte) (Tuple, error) {
	t, _, err := decode(b, false)
	return t, err
}

// findTerminator returns the index of the 0x00 that ends an escaped string
// starting at b[0] (after its type code), or -1.
func findTerminator(b []byte) int {
	for i := 0; i < len(b); i++ {
		if b[i] == 0 {
			if i+1 < len(b) && b[i+1] == 0xff {
				i++
				continue
			}
			return i
		}
	}
	return -1
}

func unescape(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		out = append(out, b[i])
		if b[i] == 0 {
			i++ // skip the 0xff escape
		}
	}
	return out
}

// fixedSize returns the size of the element that follows type code when
// the code fixes it (0 for any other), and the element's name for errors.
func fixedSize(code byte) (int, string) {
	switch {
	case code >= negIntStart && code <= posIntEnd:
		if code < intZeroCode {
			return intZeroCode - int(code), "integer"
		}
		return int(code) - intZeroCode, "integer"
	case code == floatCode:
		return 4, "float"
	case code == doubleCode:
		return 8, "double"
	case code == uuidCode:
		return 16, "UUID"
	case code == versionstampCode:
		return 12, "versionstamp"
	}
	return 0, ""
}

// byteMask has the low n bytes' bits set (n from 0 to 8).
func byteMask(n int) uint64 { return 1<<(8*uint(n)) - 1 } // 1<<64 is 0: all bits for n = 8

// bigEndianUint reads b (at most 8 bytes) as an unsigned number, most
// significant byte first.
func bigEndianUint(b []byte) uint64 {
	var s [8]byte
	copy(s[8-len(b):], b)
	return binary.BigEndian.Uint64(s[:])
}

func decode(b []byte, nested bool) (Tuple, int, error) {
	t := Tuple{}
	i := 0
	for i < len(b) {
		code := b[i]
		rest := b[i+1:]
		n, what := fixedSize(code)
		if len(rest) < n {
			return nil, 0, fmt.Errorf("%w: short %s at %d", ErrInvalidEncoding, what, i)
		}
		switch {
		case code == nullCode:
			if nested {
				if len(rest) > 0 && rest[0] == 0xff {
					t = append(t, nil)
					i += 2
					continue
				}
				return t, i + 1, nil // end of the nested tuple
			}
			t = append(t, nil)
			i++
		case code == bytesCode || code == stringCode:
			end := findTerminator(rest)
			if end < 0 {
				return nil, 0, fmt.Errorf("%w: unterminated string at %d", ErrInvalidEncoding, i)
			}
			raw := unescape(rest[:end])
			if code == bytesCode {
				t = append(t, raw)
			} else {
				t = append(t, string(raw))
			}
			i += end + 2
		case code >= negIntStart && code <= posIntEnd:
			neg := code < intZeroCode
			u := bigEndianUint(rest[:n])
			switch {
			case !neg && u > math.MaxInt64:
				t = append(t, u)
			case !neg:
				t = append(t, int64(u))
			default:
				// The stored bytes are the one's complement of the magnitude.
				mag := ^u & byteMask(n)
				if mag > 1<<63 {
					return nil, 0, fmt.Errorf("%w: integer below MinInt64 at %d", ErrInvalidEncoding, i)
				}
				t = append(t, -int64(mag)) // -(1<<63) wraps to MinInt64
			}
			i += 1 + n
		case code == floatCode:
			t = append(t, math.Float32frombits(uint32(floatOrder(bigEndianUint(rest[:n]), n, true))))
			i += 1 + n
		case code == doubleCode:
			t = append(t, math.Float64frombits(floatOrder(bigEndianUint(rest[:n]), n, true)))
			i += 1 + n
		case code == falseCode:
			t = append(t, false)
			i++
		case code == trueCode:
			t = append(t, true)
			i++
		case code == uuidCode:
			var u UUID
			copy(u[:], rest)
			t = append(t, u)
			i += 1 + n
		case code == versionstampCode:
			var v Versionstamp
			copy(v.TransactionVersion[:], rest)
			v.UserVersion = binary.BigEndian.Uint16(rest[10:12])
			t = append(t, v)
			i += 1 + n
		case code == nestedCode:
			sub, used, err := decode(rest, true)
			if err != nil {
				return nil, 0, err
			}
			t = append(t, sub)
			i += 1 + used
		default:
			return nil, 0, fmt.Errorf("%w: unknown type code 0x%02x at %d", ErrInvalidEncoding, code, i)
		}
	}
	if nested {
		return nil, 0, fmt.Errorf("%w: unterminated nested tuple", ErrInvalidEncoding)
	}
	return t, i, nil
}
