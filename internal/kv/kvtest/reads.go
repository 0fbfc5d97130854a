package kvtest

// Point reads and writes, read-your-writes, range reads (limits, reverse,
// streaming) and read-only snapshot transactions.

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/couchrep/couchrep/internal/kv"
)

func testGetSetClear(t *testing.T, db kv.Database) {
	s := newSpace(t)
	for _, tc := range []struct {
		name  string
		value []byte
	}{{"bytes", []byte("v")}, {"empty", []byte{}}, {"binary", []byte{0, 0xff, 0}}} {
		key := k(s, tc.name)
		if v := get(t, db, key); v != nil {
			t.Fatalf("%s: absent key read as %q", tc.name, v)
		}
		set(t, db, key, tc.value)
		v := get(t, db, key)
		if v == nil || !bytes.Equal(v, tc.value) {
			t.Fatalf("%s: got %q, want %q", tc.name, v, tc.value)
		}
		if err := db.Transact(testCtx(t), func(tx kv.Tx) error { tx.Clear(key); return nil }); err != nil {
			t.Fatal(err)
		}
		if v := get(t, db, key); v != nil {
			t.Fatalf("%s: cleared key read as %q", tc.name, v)
		}
	}
}

func testReadYourWrites(t *testing.T, db kv.Database) {
	s := newSpace(t)
	set(t, db, k(s, "a"), []byte("stored-a"))
	set(t, db, k(s, "b"), []byte("stored-b"))
	set(t, db, k(s, "c"), []byte("stored-c"))
	set(t, db, k(s, "n"), kv.EncodeInt64LE(40))
	err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		tx.Set(k(s, "a"), []byte("new-a"))
		tx.Clear(k(s, "b"))
		tx.Set(k(s, "d"), []byte("new-d"))
		tx.ClearRange(k(s, "c"), k(s, "d"))
		tx.Set(k(s, "c2"), []byte("after-clear"))
		tx.Add(k(s, "n"), 2)
		for _, c := range []struct {
			key  string
			want []byte
		}{{"a", []byte("new-a")}, {"b", nil}, {"c", nil}, {"c2", []byte("after-clear")}, {"d", []byte("new-d")}, {"n", kv.EncodeInt64LE(42)}} {
			v, err := tx.Get(k(s, c.key))
			if err != nil {
				return err
			}
			if !bytes.Equal(v, c.want) || (v == nil) != (c.want == nil) {
				return fmt.Errorf("Get(%s) = %q, want %q", c.key, v, c.want)
			}
		}
		b, e := s.Range()
		got := collect(tx.GetRange(b, e, kv.RangeOptions{}))
		want := []string{"a=new-a", "c2=after-clear", "d=new-d", "n=" + string(kv.EncodeInt64LE(42))}
		if err := sameEntries(s, got, want); err != nil {
			return fmt.Errorf("merged range: %w", err)
		}
		gotRev := collect(tx.GetRange(b, e, kv.RangeOptions{Reverse: true, Limit: 2}))
		if err := sameEntries(s, gotRev, []string{want[3], want[2]}); err != nil {
			return fmt.Errorf("merged reverse range: %w", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if v := get(t, db, k(s, "c2")); string(v) != "after-clear" {
		t.Fatalf("write after ClearRange lost: %q", v)
	}
	if v := get(t, db, k(s, "c")); v != nil {
		t.Fatalf("ClearRange did not clear: %q", v)
	}
}

func testRange(t *testing.T, db kv.Database) {
	s := newSpace(t)
	if err := db.Transact(testCtx(t), func(tx kv.Tx) error {
		for i := range 10 {
			tx.Set(k(s, int64(i)), []byte{byte('0' + i)})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b, e := s.Range()
	for _, tc := range []struct {
		name       string
		begin, end []byte
		opts       kv.RangeOptions
		want       string
	}{
		{"all", b, e, kv.RangeOptions{}, "0123456789"},
		{"limit", b, e, kv.RangeOptions{Limit: 3}, "012"},
		{"reverse", b, e, kv.RangeOptions{Reverse: true}, "9876543210"},
		{"reverse limit", b, e, kv.RangeOptions{Reverse: true, Limit: 4}, "9876"},
		{"begin inclusive end exclusive", k(s, 3), k(s, 7), kv.RangeOptions{}, "3456"},
		{"reverse bounds", k(s, 3), k(s, 7), kv.RangeOptions{Reverse: true}, "6543"},
		{"limit above size", k(s, 8), e, kv.RangeOptions{Limit: 100}, "89"},
		{"empty", k(s, 5), k(s, 5), kv.RangeOptions{}, ""},
		{"inverted", k(s, 7), k(s, 3), kv.RangeOptions{}, ""},
		{"between keys", append(k(s, 2), 0), k(s, 4), kv.RangeOptions{}, "3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []byte
			if err := db.ReadTransact(testCtx(t), func(tx kv.ReadTx) error {
				it := tx.GetRange(tc.begin, tc.end, tc.opts)
				for it.Next() {
					got = append(got, it.KeyValue().Value...)
				}
				return it.Err()
			}); err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func testRangeStreaming(t *testing.T, db kv.Database) {
	s := newSpace(t)
	const n = 5000
	value := bytes.Repeat([]byte("x"), 300) // 1.5 MB in all: many pages
	for start := 0; start < n; start += 1000 {
		if err := db.Transact(testCtx(t), func(tx kv.Tx) error {
			for i := start; i < start+1000; i++ {
				tx.Set(k(s, int64(i)), value)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	b, e := s.Range()
	for _, reverse := range []bool{false, true} {
		for _, limit := range []int{0, 1025, 4999} {
			count, prev := 0, int64(-1)
			if reverse {
				prev = n
			}
			err := db.ReadTransact(testCtx(t), func(tx kv.ReadTx) error {
				it := tx.GetRange(b, e, kv.RangeOptions{Reverse: reverse, Limit: limit})
				for it.Next() {
					tup, err := s.Unpack(it.KeyValue().Key)
					if err != nil {
						return err
					}
					i := tup[0].(int64)
					if (!reverse && i != prev+1) || (reverse && i != prev-1) {
						return fmt.Errorf("key %d after %d", i, prev)
					}
					prev = i
					count++
				}
				return it.Err()
			})
			if err != nil {
				t.Fatal(err)
			}
			want := n
			if limit > 0 {
				want = limit
			}
			if count != want {
				t.Fatalf("reverse=%v limit=%d: %d entries, want %d", reverse, limit, count, want)
			}
		}
	}
}

func testReadTransact(t *testing.T, db kv.Database) {
	s := newSpace(t)
	set(t, db, k(s, "a"), []byte("1"))
	set(t, db, k(s, "b"), []byte("1"))
	err := db.ReadTransact(testCtx(t), func(tx kv.ReadTx) error {
		a, err := tx.Get(k(s, "a"))
		if err != nil {
			return err
		}
		// A commit in between is not visible: the read is one snapshot.
		if err := db.Transact(testCtx(t), func(w kv.Tx) error {
			w.Set(k(s, "a"), []byte("2"))
			w.Set(k(s, "b"), []byte("2"))
			return nil
		}); err != nil {
			return err
		}
		b, err := tx.Get(k(s, "b"))
		if err != nil {
			return err
		}
		if string(a) != string(b) {
			return fmt.Errorf("inconsistent snapshot: a=%s b=%s", a, b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
