package kv

import (
	"errors"
	"fmt"
	"testing"
)

// sliceIter yields kvs through one reused key buffer, as backends may, then
// fails with err.
type sliceIter struct {
	kvs []KeyValue
	err error
	i   int
	buf []byte
}

func (s *sliceIter) Next() bool {
	if s.i >= len(s.kvs) {
		return false
	}
	s.buf = append(s.buf[:0], s.kvs[s.i].Key...)
	s.i++
	return true
}

func (s *sliceIter) KeyValue() KeyValue { return KeyValue{Key: s.buf} }
func (s *sliceIter) Err() error         { return s.err }

func TestKeys(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		kvs  []KeyValue
		err  error
		want string
	}{
		{"empty", nil, nil, "[]"},
		{"copies", []KeyValue{{Key: []byte("a")}, {Key: []byte("bb")}, {Key: []byte("c")}}, nil, "[a bb c]"},
		{"error", []KeyValue{{Key: []byte("a")}}, boom, "[a]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys, err := Keys(&sliceIter{kvs: tc.kvs, err: tc.err})
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if got := fmt.Sprintf("%s", keys); got != tc.want {
				t.Fatalf("keys = %s, want %s", got, tc.want)
			}
		})
	}
}
