package postgres

import (
	"bytes"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

// TestWireCodec: the binary parameters and rows of wire.go against pgx's
// own codecs (bytea[] both ways, integers), and its refusals.
func TestWireCodec(t *testing.T) {
	m := pgtype.NewMap()
	for _, a := range [][][]byte{{}, {[]byte("k")}, {{}, []byte("\x00\xff"), bytes.Repeat([]byte("v"), 300)}} {
		_, got, err := appendParam([]byte("junk"), pgtype.ByteaArrayOID, a)
		if err != nil {
			t.Fatal(err)
		}
		var back [][]byte
		if err := m.Scan(pgtype.ByteaArrayOID, pgtype.BinaryFormatCode, got, &back); err != nil {
			t.Fatalf("pgx cannot read bytea[] %x: %v", got, err)
		}
		dec, err := decodeByteaArray(got)
		if err != nil || len(back) != len(a) || len(dec) != len(a) {
			t.Fatalf("%q: pgx read %q, decodeByteaArray %q (%v)", a, back, dec, err)
		}
		for i := range a {
			if !bytes.Equal(back[i], a[i]) || !bytes.Equal(dec[i], a[i]) {
				t.Errorf("%q: element %d: pgx %q, decodeByteaArray %q", a, i, back[i], dec[i])
			}
		}
		// What pgx itself sends for it decodes the same.
		pg, err := m.Encode(pgtype.ByteaArrayOID, pgtype.BinaryFormatCode, a, nil)
		if err != nil {
			t.Fatal(err)
		}
		if dec, err := decodeByteaArray(pg); err != nil || len(dec) != len(a) {
			t.Errorf("%q: pgx's encoding %x decodes as %q (%v)", a, pg, dec, err)
		}
	}
	_, ints, err := appendParam(nil, pgtype.Int4ArrayOID, []int32{0, -1, 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	var back []int32
	if err := m.Scan(pgtype.Int4ArrayOID, pgtype.BinaryFormatCode, ints, &back); err != nil || len(back) != 3 || back[1] != -1 || back[2] != 1<<30 {
		t.Errorf("integer[]: pgx read %v (%v)", back, err)
	}
	for _, tc := range []struct {
		oid  uint32
		v    any
		want int64
	}{{pgtype.Int2OID, int32(-7), -7}, {pgtype.Int4OID, 1 << 20, 1 << 20}, {pgtype.Int8OID, int64(-1) << 40, -1 << 40}} {
		_, b, err := appendParam(make([]byte, 3, 3), tc.oid, tc.v)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := m.Scan(tc.oid, pgtype.BinaryFormatCode, b, &n); err != nil || n != tc.want {
			t.Errorf("type %d: %v read back as %d (%v)", tc.oid, tc.v, n, err)
		}
	}
	// Parameters appended one after another keep their bytes.
	buf, p1, _ := appendParam(nil, pgtype.ByteaOID, []byte("first"))
	_, p2, _ := appendParam(buf, pgtype.ByteaArrayOID, [][]byte{bytes.Repeat([]byte("x"), 5000)})
	if string(p1) != "first" || len(p2) != 12+8+4+5000 {
		t.Errorf("appended parameters %q and %d bytes", p1, len(p2))
	}
	if v, err := decodeInt8([]byte{0, 0, 0, 0, 0, 0, 1, 2}); err != nil || v != 258 {
		t.Errorf("decodeInt8 = %d, %v", v, err)
	}
	if _, p, err := appendParam(nil, pgtype.TextOID, (*string)(nil)); err != nil || p != nil {
		t.Errorf("a nil *string is %q, %v; want NULL", p, err)
	}
	for _, bad := range []struct {
		oid uint32
		v   any
	}{{pgtype.Int2OID, 1 << 16}, {pgtype.Int4OID, int64(1) << 32}, {pgtype.ByteaOID, "s"}, {pgtype.ByteaArrayOID, []string{"s"}}, {pgtype.BoolOID, true}} {
		if _, _, err := appendParam(nil, bad.oid, bad.v); err == nil {
			t.Errorf("appendParam(%d, %#v) took it", bad.oid, bad.v)
		}
	}
	for _, bad := range [][]byte{{1}, {0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 17, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 9, 'x'},
		{0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0, 0, 1}} {
		if v, err := decodeByteaArray(bad); err == nil {
			t.Errorf("decodeByteaArray(%x) = %q, want an error", bad, v)
		}
	}
	if _, err := decodeBool(nil); err == nil {
		t.Error("decodeBool(NULL) took it")
	}
}
