package tuple

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

const ff = 0xff

// Vectors from apple/foundationdb: design/tuple.md test cases and the Java
// binding's TupleSerializationTest (bindings/java/src/test/.../tuple).
var vectors = []struct {
	name   string
	tuple  Tuple
	packed []byte
	// decoded is what Unpack returns when it differs from tuple.
	decoded Tuple
}{
	{"empty", Tuple{}, []byte{}, nil},
	{"spec bytes", Tuple{[]byte("foo\x00bar")}, []byte("\x01foo\x00\xffbar\x00"), nil},
	{"spec unicode", Tuple{"F\u00d4O\u0000bar"}, []byte("\x02F\xc3\x94O\x00\xffbar\x00"), nil},
	{"spec nested", Tuple{Tuple{[]byte("foo\x00bar"), nil, Tuple{}}}, []byte("\x05\x01foo\x00\xffbar\x00\x00\xff\x05\x00\x00"), nil},
	{"spec int", Tuple{-5551212}, []byte("\x11\xabK\x93"), Tuple{int64(-5551212)}},
	{"spec float", Tuple{float32(-42)}, []byte("\x20\x3d\xd7\xff\xff"), nil},
	{"zero", Tuple{0}, []byte{0x14}, Tuple{int64(0)}},
	{"one", Tuple{int64(1)}, []byte{0x15, 0x01}, nil},
	{"minus one", Tuple{int64(-1)}, []byte{0x13, ff - 1}, nil},
	{"255", Tuple{int64(255)}, []byte{0x15, ff}, nil},
	{"-255", Tuple{int64(-255)}, []byte{0x13, 0x00}, nil},
	{"256", Tuple{int64(256)}, []byte{0x16, 0x01, 0x00}, nil},
	{"-256", Tuple{int64(-256)}, []byte{0x12, ff - 1, ff}, nil},
	{"65536", Tuple{int32(65536)}, []byte{0x17, 0x01, 0x00, 0x00}, Tuple{int64(65536)}},
	{"-65536", Tuple{int32(-65536)}, []byte{0x11, ff - 1, ff, ff}, Tuple{int64(-65536)}},
	{"MaxInt64", Tuple{int64(math.MaxInt64)}, []byte{0x1c, 0x7f, ff, ff, ff, ff, ff, ff, ff}, nil},
	{"MaxInt64+1", Tuple{uint64(math.MaxInt64 + 1)}, []byte{0x1c, 0x80, 0, 0, 0, 0, 0, 0, 0}, nil},
	{"MaxUint64", Tuple{uint64(math.MaxUint64)}, []byte{0x1c, ff, ff, ff, ff, ff, ff, ff, ff}, nil},
	{"-(2^32-1)", Tuple{int64(-(1<<32 - 1))}, []byte{0x10, 0, 0, 0, 0}, nil},
	{"MinInt64+2", Tuple{int64(math.MinInt64 + 2)}, []byte{0x0c, 0x80, 0, 0, 0, 0, 0, 0, 0x01}, nil},
	{"MinInt64+1", Tuple{int64(math.MinInt64 + 1)}, []byte{0x0c, 0x80, 0, 0, 0, 0, 0, 0, 0}, nil},
	{"MinInt64", Tuple{int64(math.MinInt64)}, []byte{0x0c, 0x7f, ff, ff, ff, ff, ff, ff, ff}, nil},
	{"3.14f", Tuple{float32(3.14)}, []byte{0x20, 0xc0, 0x48, 0xf5, 0xc3}, nil},
	{"-3.14f", Tuple{float32(-3.14)}, []byte{0x20, 0x3f, 0xb7, 0x0a, 0x3c}, nil},
	{"3.14", Tuple{3.14}, []byte{0x21, 0xc0, 0x09, 0x1e, 0xb8, 0x51, 0xeb, 0x85, 0x1f}, nil},
	{"-3.14", Tuple{-3.14}, []byte{0x21, 0x3f, 0xf6, 0xe1, 0x47, 0xae, 0x14, 0x7a, 0xe0}, nil},
	{"0.0f", Tuple{float32(0)}, []byte{0x20, 0x80, 0, 0, 0}, nil},
	{"-0.0f", Tuple{float32(math.Copysign(0, -1))}, []byte{0x20, 0x7f, ff, ff, ff}, nil},
	{"0.0", Tuple{0.0}, []byte{0x21, 0x80, 0, 0, 0, 0, 0, 0, 0}, nil},
	{"-0.0", Tuple{math.Copysign(0, -1)}, []byte{0x21, 0x7f, ff, ff, ff, ff, ff, ff, ff}, nil},
	{"+inf f", Tuple{float32(math.Inf(1))}, []byte{0x20, ff, 0x80, 0, 0}, nil},
	{"-inf f", Tuple{float32(math.Inf(-1))}, []byte{0x20, 0x00, 0x7f, ff, ff}, nil},
	{"+inf", Tuple{math.Inf(1)}, []byte{0x21, ff, 0xf0, 0, 0, 0, 0, 0, 0}, nil},
	{"-inf", Tuple{math.Inf(-1)}, []byte{0x21, 0x00, 0x0f, ff, ff, ff, ff, ff, ff}, nil},
	{"empty bytes", Tuple{[]byte{}}, []byte{0x01, 0x00}, nil},
	{"bytes", Tuple{[]byte{1, 2, 3}}, []byte{0x01, 1, 2, 3, 0x00}, nil},
	{"bytes nul", Tuple{[]byte{0, 0, 0, 4}}, []byte{0x01, 0, ff, 0, ff, 0, ff, 4, 0}, nil},
	{"empty string", Tuple{""}, []byte{0x02, 0x00}, nil},
	{"hello", Tuple{"hello"}, []byte("\x02hello\x00"), nil},
	{"chinese", Tuple{"\u4e2d\u6587"}, []byte{0x02, 0xe4, 0xb8, 0xad, 0xe6, 0x96, 0x87, 0x00}, nil},
	{"emoji", Tuple{"\U0001f525"}, []byte{0x02, 0xf0, 0x9f, 0x94, 0xa5, 0x00}, nil},
	{"max code point", Tuple{"\U0010ffff"}, []byte{0x02, 0xf4, 0x8f, 0xbf, 0xbf, 0x00}, nil},
	{"nested null", Tuple{Tuple{nil}}, []byte{0x05, 0x00, ff, 0x00}, nil},
	{"nested null hello", Tuple{Tuple{nil, "hello"}}, []byte("\x05\x00\xff\x02hello\x00\x00"), nil},
	{"nested null hell0", Tuple{Tuple{nil, "hell\x00"}}, []byte("\x05\x00\xff\x02hell\x00\xff\x00\x00"), nil},
	{"nested then string", Tuple{Tuple{nil}, "hello"}, []byte("\x05\x00\xff\x00\x02hello\x00"), nil},
	{"nested mix", Tuple{Tuple{nil}, "hello", []byte{1, 0}, []byte{}},
		[]byte("\x05\x00\xff\x00\x02hello\x00\x01\x01\x00\xff\x00\x01\x00"), nil},
	{"uuid", Tuple{UUID{ff, ff, ff, ff, 0xba, 0x5e, 0xba, 0x11, 0, 0, 0, 0, 0x5c, 0xa1, 0xab, 0x1e}},
		[]byte{0x30, ff, ff, ff, ff, 0xba, 0x5e, 0xba, 0x11, 0, 0, 0, 0, 0x5c, 0xa1, 0xab, 0x1e}, nil},
	{"false", Tuple{false}, []byte{0x26}, nil},
	{"true", Tuple{true}, []byte{0x27}, nil},
	{"short", Tuple{int16(0x3019)}, []byte{0x16, 0x30, 0x19}, Tuple{int64(0x3019)}},
	{"byte", Tuple{uint8(3)}, []byte{0x15, 0x03}, Tuple{int64(3)}},
	{"versionstamp", Tuple{Versionstamp{TransactionVersion: [10]byte{0xaa, 0xbb, 0xcc, 0xdd, 0xee, ff, 0, 1, 2, 3}}},
		[]byte{0x33, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, ff, 0, 1, 2, 3, 0, 0}, nil},
	{"versionstamp user", Tuple{Versionstamp{TransactionVersion: [10]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, UserVersion: 657}},
		[]byte{0x33, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0x02, 0x91}, nil},
	{"null top level", Tuple{nil, "a"}, []byte("\x00\x02a\x00"), nil},
	// The FDB Go binding's TestTupleString: Tuple{[]byte("hello"), "world", 42, 0x99}.
	{"go binding string", Tuple{[]byte("hello"), "world", 42, 0x99}, []byte("\x01hello\x00\x02world\x00\x15*\x15\x99"),
		Tuple{[]byte("hello"), "world", int64(42), int64(0x99)}},
}

func TestPackVectors(t *testing.T) {
	for _, v := range vectors {
		t.Run(v.name, func(t *testing.T) {
			got := v.tuple.Pack()
			if !bytes.Equal(got, v.packed) {
				t.Fatalf("Pack(%v) = %x, want %x", v.tuple, got, v.packed)
			}
			back, err := Unpack(v.packed)
			if err != nil {
				t.Fatalf("Unpack(%x): %v", v.packed, err)
			}
			want := v.decoded
			if want == nil {
				want = v.tuple
			}
			if !reflect.DeepEqual(back, want) {
				t.Fatalf("Unpack(%x) = %#v, want %#v", v.packed, back, want)
			}
		})
	}
}

func TestUnpackErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"unknown code", []byte{0x40}},
		{"unterminated bytes", []byte{0x01, 'a'}},
		{"short int", []byte{0x16, 0x01}},
		{"short float", []byte{0x20, 0x01}},
		{"short double", []byte{0x21, 0x01}},
		{"short uuid", []byte{0x30, 0x01}},
		{"short versionstamp", []byte{0x33, 0x01}},
		{"unterminated nested", []byte{0x05, 0x15, 0x01}},
		{"below MinInt64", []byte{0x0c, 0, 0, 0, 0, 0, 0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Unpack(tc.in); !errors.Is(err, ErrInvalidEncoding) {
				t.Fatalf("Unpack(%x) err = %v, want ErrInvalidEncoding", tc.in, err)
			}
		})
	}
}

func TestPackUnsupported(t *testing.T) {
	if _, err := (Tuple{struct{}{}}).PackChecked(); !errors.Is(err, ErrUnsupportedType) {
		t.Fatalf("err = %v, want ErrUnsupportedType", err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Pack of an unsupported type did not panic")
		}
	}()
	_ = Tuple{map[string]int{}}.Pack()
}

func TestOrderPreserved(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ints := []int64{math.MinInt64, math.MinInt64 + 1, -1 << 40, -65536, -256, -255, -1, 0, 1, 255, 256, 65535, 1 << 40, math.MaxInt64}
	for range 200 {
		ints = append(ints, int64(rng.Uint64()))
	}
	slices.Sort(ints)
	checkSorted(t, "ints", len(ints), func(i int) Tuple { return Tuple{ints[i]} })

	floats := []float64{math.Inf(-1), -1e300, -3.14, -1e-300, math.Copysign(0, -1), 0, 1e-300, 3.14, 1e300, math.Inf(1)}
	checkSorted(t, "floats", len(floats), func(i int) Tuple { return Tuple{floats[i]} })

	strs := []string{"", "\x00", "\x00\x00", "\x00\xff", "\x01", "a", "a\x00", "a\x00b", "ab", "b", "\xff"}
	checkSorted(t, "strings", len(strs), func(i int) Tuple { return Tuple{strs[i]} })
	checkSorted(t, "bytes", len(strs), func(i int) Tuple { return Tuple{[]byte(strs[i])} })

	// A tuple sorts before the tuples it prefixes; nested tuples likewise.
	prefixes := []Tuple{{}, {nil}, {nil, nil}, {Tuple{}}, {Tuple{nil}}, {Tuple{nil, int64(1)}}, {Tuple{int64(1)}}, {int64(1)}, {int64(1), nil}, {int64(1), "a"}}
	checkSorted(t, "prefixes", len(prefixes), func(i int) Tuple { return prefixes[i] })
}

func checkSorted(t *testing.T, name string, n int, at func(int) Tuple) {
	t.Helper()
	for i := 1; i < n; i++ {
		a, b := at(i-1).Pack(), at(i).Pack()
		if c := bytes.Compare(a, b); c > 0 || (c == 0 && !reflect.DeepEqual(at(i-1), at(i))) {
			t.Errorf("%s: %v (%x) does not sort before %v (%x)", name, at(i-1), a, at(i), b)
		}
	}
}

func TestRoundTripRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 500 {
		tup := randomTuple(rng, 2)
		back, err := Unpack(tup.Pack())
		if err != nil {
			t.Fatalf("Unpack(Pack(%v)): %v", tup, err)
		}
		if !reflect.DeepEqual(back, tup) {
			t.Fatalf("round trip: got %#v, want %#v", back, tup)
		}
	}
}

func randomTuple(rng *rand.Rand, depth int) Tuple {
	n := rng.IntN(5)
	t := Tuple{}
	for range n {
		switch k := rng.IntN(9); {
		case k == 0:
			t = append(t, nil)
		case k == 1:
			b := make([]byte, rng.IntN(6))
			for i := range b {
				b[i] = byte(rng.IntN(3)) * 0x7f // plenty of 0x00 and 0xfe
			}
			t = append(t, b)
		case k == 2:
			t = append(t, string([]byte{byte(rng.IntN(2)), 'x'}))
		case k == 3:
			t = append(t, int64(rng.Uint64())>>rng.IntN(64))
		case k == 4:
			t = append(t, rng.NormFloat64())
		case k == 5:
			t = append(t, rng.IntN(2) == 0)
		case k == 6:
			var u UUID
			for i := range u {
				u[i] = byte(rng.Uint32())
			}
			t = append(t, u)
		case k == 7:
			t = append(t, Versionstamp{TransactionVersion: [10]byte{byte(rng.Uint32()), 9}, UserVersion: uint16(rng.Uint32())})
		case k == 8 && depth > 0:
			t = append(t, randomTuple(rng, depth-1))
		}
	}
	return t
}

func TestPackWithVersionstamp(t *testing.T) {
	prefix := []byte("pfx")
	key, off, err := Tuple{"a", IncompleteVersionstamp(7)}.PackWithVersionstamp(prefix)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte("pfx\x02a\x00\x33"), append(bytes.Repeat([]byte{ff}, 10), 0, 7)...)
	if !bytes.Equal(key, want) || off != len("pfx\x02a\x00\x33") {
		t.Fatalf("got %x at %d, want %x at %d", key, off, want, len("pfx\x02a\x00\x33"))
	}
	// Nested stamps count too.
	if _, off, err := (Tuple{Tuple{IncompleteVersionstamp(0)}}).PackWithVersionstamp(nil); err != nil || off != 2 {
		t.Fatalf("nested: off %d err %v", off, err)
	}
	for _, bad := range []Tuple{{"a"}, {IncompleteVersionstamp(0), IncompleteVersionstamp(1)}} {
		if _, _, err := bad.PackWithVersionstamp(nil); !errors.Is(err, ErrVersionstamp) {
			t.Errorf("%v: err = %v, want ErrVersionstamp", bad, err)
		}
	}
	if !(Tuple{Tuple{IncompleteVersionstamp(0)}}).HasIncompleteVersionstamp() || (Tuple{"x"}).HasIncompleteVersionstamp() {
		t.Fatal("HasIncompleteVersionstamp wrong")
	}
}

func TestSubspace(t *testing.T) {
	s := NewSubspace([]byte{0xfe}, Tuple{"jobs"})
	sub := s.Sub(int64(1), "x")
	key := sub.Pack(Tuple{"id"})
	if !bytes.Equal(key, []byte("\xfe\x02jobs\x00\x15\x01\x02x\x00\x02id\x00")) {
		t.Fatalf("key = %x", key)
	}
	if !s.Contains(key) || !sub.Contains(key) {
		t.Fatal("Contains = false for a key inside")
	}
	got, err := s.Unpack(key)
	if err != nil || !reflect.DeepEqual(got, Tuple{int64(1), "x", "id"}) {
		t.Fatalf("Unpack = %v, %v", got, err)
	}
	if _, err := sub.Unpack([]byte("\xfe\x02other\x00")); !errors.Is(err, ErrNotInSubspace) {
		t.Fatalf("Unpack outside: err = %v", err)
	}
	b, e := sub.Range()
	if bytes.Compare(b, key) > 0 || bytes.Compare(key, e) >= 0 {
		t.Fatalf("key %x outside Range [%x, %x)", key, b, e)
	}
	if bytes.Compare(b, sub.Bytes()) <= 0 {
		t.Fatal("Range begin must exclude the prefix itself")
	}
	vk, off, err := sub.PackWithVersionstamp(Tuple{IncompleteVersionstamp(1)})
	if err != nil || !bytes.Equal(vk[off-1:off], []byte{0x33}) || !sub.Contains(vk) {
		t.Fatalf("PackWithVersionstamp = %x, %d, %v", vk, off, err)
	}
}
