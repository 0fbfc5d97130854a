package sqlite

import (
	"bytes"
	"testing"

	"github.com/couchrep/couchrep/internal/kv/kvbuf"
)

// TestOwnCommitsBounded: the log of this process's commits forgets its
// oldest commits once their keys hold more than ownLogMaxBytes (or there
// are more than ownLogCap), and never remembers a commit larger than that.
func TestOwnCommitsBounded(t *testing.T) {
	key := func(n int) []byte { return bytes.Repeat([]byte{'k'}, n) }
	batch := func(keys, keyLen int) *touchedKeys {
		tk := &touchedKeys{}
		for range keys {
			tk.keys = append(tk.keys, key(keyLen))
		}
		return tk
	}
	tests := []struct {
		name             string
		commits          int
		keys, keyLen     int
		ranges           bool
		wantMax, wantMin int // commits remembered at the end
	}{
		{name: "small commits: the count bounds", commits: 2 * ownLogCap, keys: 2, keyLen: 40, wantMin: ownLogCap, wantMax: ownLogCap},
		{name: "large commits: the bytes bound", commits: 400, keys: 200, keyLen: 100, wantMin: 1, wantMax: ownLogMaxBytes / (200 * 124)},
		{name: "one commit over the bound: not remembered", commits: 3, keys: ownLogMaxKeys, keyLen: 200, wantMax: 0},
		{name: "ranges count", commits: 2 * ownLogCap, keys: 0, ranges: true, wantMin: 1, wantMax: ownLogMaxBytes / (40 * (48 + 2*500))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var o ownCommits
			for v := range tc.commits {
				tk := batch(tc.keys, tc.keyLen)
				if tc.ranges {
					for range 40 {
						tk.ranges = append(tk.ranges, kvbuf.Range{Begin: key(500), End: key(500)})
					}
				}
				o.add(int64(v+1), tk)
				if o.bytes > ownLogMaxBytes {
					t.Fatalf("after commit %d: %d bytes remembered, bound %d", v+1, o.bytes, ownLogMaxBytes)
				}
			}
			if n := len(o.byVersion); n < tc.wantMin || n > tc.wantMax || n != len(o.order) {
				t.Fatalf("%d commits remembered (order %d), want %d..%d", n, len(o.order), tc.wantMin, tc.wantMax)
			}
			total := 0
			for i, v := range o.order {
				if i > 0 && v != o.order[i-1]+1 {
					t.Fatalf("remembered versions not the newest in a row: %v", o.order)
				}
				total += o.byVersion[v].size()
			}
			if total != o.bytes {
				t.Fatalf("bytes %d, the remembered commits hold %d", o.bytes, total)
			}
			if len(o.order) > 0 && o.order[len(o.order)-1] != int64(tc.commits) {
				t.Fatalf("the newest commit %d not remembered: %v", tc.commits, o.order[len(o.order)-1])
			}
		})
	}
}
