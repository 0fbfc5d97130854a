package replicate

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/big"
	"strings"
)

// This file holds a minimal encoder for Erlang's external term format (ETF),
// exactly as `term_to_binary(T, [{minor_version, 1}])` writes it. CouchDB
// hashes such an encoding to build replication ids, so the bytes must match.
//
// Go values map to Erlang terms as follows:
//
//	etfAtom      atom            ATOM_EXT (latin-1 atoms, minor_version 1)
//	etfString    charlist        STRING_EXT ("" is NIL_EXT)
//	etfBinary    binary          BINARY_EXT
//	etfTuple     tuple           SMALL_TUPLE_EXT / LARGE_TUPLE_EXT
//	etfList      proper list     LIST_EXT ... NIL_EXT (empty: NIL_EXT)
//	int, int64   integer         SMALL_INTEGER_EXT / INTEGER_EXT / SMALL_BIG_EXT
//	*big.Int     integer         as above
//	float64      float           NEW_FLOAT_EXT
//
// JSON values are converted to CouchDB's EJSON shape (jiffy's decoding) by
// ejson: objects {[{Key, Value}]}, arrays lists, strings binaries, numbers
// integers or floats, true/false/null atoms.

type (
	etfAtom   string
	etfString string
	etfBinary string
	etfTuple  []any
	etfList   []any
)

const (
	etfVersion        = 131
	etfNewFloatExt    = 70
	etfSmallIntExt    = 97
	etfIntExt         = 98
	etfAtomExt        = 100
	etfSmallTupleExt  = 104
	etfLargeTupleExt  = 105
	etfNilExt         = 106
	etfStringExt      = 107
	etfListExt        = 108
	etfBinaryExt      = 109
	etfSmallBigExt    = 110
	etfLargeBigExt    = 111
	etfMaxStringExt   = 65535
	etfMaxAtomLength  = 255
	etfSmallTupleMax  = 255
	etfSmallBigMaxLen = 255
)

// termToBinary returns the ETF encoding of t, with the version byte.
func termToBinary(t any) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte(etfVersion)
	if err := encodeTerm(&b, t); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func encodeTerm(b *bytes.Buffer, t any) error {
	switch v := t.(type) {
	case etfAtom:
		if len(v) > etfMaxAtomLength {
			return fmt.Errorf("replication: etf: atom too long: %q", string(v))
		}
		for i := 0; i < len(v); i++ {
			if v[i] >= 0x80 {
				return fmt.Errorf("replication: etf: non-ASCII atom %q", string(v))
			}
		}
		b.WriteByte(etfAtomExt)
		writeU16(b, len(v))
		b.WriteString(string(v))
	case etfString:
		switch {
		case len(v) == 0:
			b.WriteByte(etfNilExt)
		case len(v) <= etfMaxStringExt:
			b.WriteByte(etfStringExt)
			writeU16(b, len(v))
			b.WriteString(string(v))
		default:
			// A long charlist is a proper list of small integers.
			b.WriteByte(etfListExt)
			writeU32(b, len(v))
			for i := 0; i < len(v); i++ {
				b.WriteByte(etfSmallIntExt)
				b.WriteByte(v[i])
			}
			b.WriteByte(etfNilExt)
		}
	case etfBinary:
		b.WriteByte(etfBinaryExt)
		writeU32(b, len(v))
		b.WriteString(string(v))
	case etfTuple:
		writeSized(b, len(v), etfSmallTupleMax, etfSmallTupleExt, etfLargeTupleExt)
		for _, e := range v {
			if err := encodeTerm(b, e); err != nil {
				return err
			}
		}
	case etfList:
		if len(v) == 0 {
			b.WriteByte(etfNilExt)
			return nil
		}
		b.WriteByte(etfListExt)
		writeU32(b, len(v))
		for _, e := range v {
			if err := encodeTerm(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(etfNilExt)
	case int:
		encodeInt(b, big.NewInt(int64(v)))
	case int64:
		encodeInt(b, big.NewInt(v))
	case *big.Int:
		encodeInt(b, v)
	case float64:
		b.WriteByte(etfNewFloatExt)
		var f [8]byte
		binary.BigEndian.PutUint64(f[:], math.Float64bits(v))
		b.Write(f[:])
	default:
		return fmt.Errorf("replication: etf: unsupported term type %T", t)
	}
	return nil
}

func encodeInt(b *bytes.Buffer, n *big.Int) {
	if n.IsInt64() {
		i := n.Int64()
		switch {
		case i >= 0 && i <= 255:
			b.WriteByte(etfSmallIntExt)
			b.WriteByte(byte(i))
			return
		case i >= math.MinInt32 && i <= math.MaxInt32:
			b.WriteByte(etfIntExt)
			var w [4]byte
			binary.BigEndian.PutUint32(w[:], uint32(int32(i)))
			b.Write(w[:])
			return
		}
	}
	mag := new(big.Int).Abs(n).Bytes() // big-endian
	writeSized(b, len(mag), etfSmallBigMaxLen, etfSmallBigExt, etfLargeBigExt)
	if n.Sign() < 0 {
		b.WriteByte(1)
	} else {
		b.WriteByte(0)
	}
	for i := len(mag) - 1; i >= 0; i-- { // little-endian digits
		b.WriteByte(mag[i])
	}
}

func writeU16(b *bytes.Buffer, n int) {
	var w [2]byte
	binary.BigEndian.PutUint16(w[:], uint16(n))
	b.Write(w[:])
}

// writeSized writes the tag and size of a term that has a small form (size
// up to smallMax, in one byte) and a large one (in four bytes): tuples and
// bignums.
func writeSized(b *bytes.Buffer, n, smallMax int, smallTag, largeTag byte) {
	if n <= smallMax {
		b.WriteByte(smallTag)
		b.WriteByte(byte(n))
		return
	}
	b.WriteByte(largeTag)
	writeU32(b, n)
}

func writeU32(b *bytes.Buffer, n int) {
	var w [4]byte
	binary.BigEndian.PutUint32(w[:], uint32(n))
	b.Write(w[:])
}

// ejson decodes one JSON value into the Erlang term jiffy would produce:
// objects keep their key order and duplicates ({[{K, V}, ...]}).
func ejson(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := ejsonValue(dec)
	if err != nil {
		return nil, fmt.Errorf("replication: decode json: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("replication: decode json: trailing data")
	}
	return v, nil
}

func ejsonValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			props := etfList{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, ok := kt.(string)
				if !ok {
					return nil, fmt.Errorf("object key is %T", kt)
				}
				v, err := ejsonValue(dec)
				if err != nil {
					return nil, err
				}
				props = append(props, etfTuple{etfBinary(k), v})
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return etfTuple{props}, nil
		case '[':
			items := etfList{}
			for dec.More() {
				v, err := ejsonValue(dec)
				if err != nil {
					return nil, err
				}
				items = append(items, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return items, nil
		}
		return nil, fmt.Errorf("unexpected delimiter %v", t)
	case string:
		return etfBinary(t), nil
	case bool:
		if t {
			return etfAtom("true"), nil
		}
		return etfAtom("false"), nil
	case nil:
		return etfAtom("null"), nil
	case json.Number:
		s := string(t)
		if strings.ContainsAny(s, ".eE") {
			f, err := t.Float64()
			if err != nil {
				return nil, err
			}
			return f, nil
		}
		n, ok := new(big.Int).SetString(s, 10)
		if !ok {
			return nil, fmt.Errorf("bad integer %q", s)
		}
		return n, nil
	}
	return nil, fmt.Errorf("unexpected token %v", tok)
}
