package postgres

import (
	"fmt"
	"hash/fnv"
	"testing"
)

// TestKeyHash: the NOTIFY payload's key hashes are FNV-1a as hash/fnv
// computes them, in fmt's %016x, so that nodes of every build agree on
// them.
func TestKeyHash(t *testing.T) {
	for _, k := range [][]byte{nil, {}, {0}, []byte("a"), []byte("\x01jobs\x00\x15\x01bench\x00job-42\x00"), make([]byte, 300)} {
		h := fnv.New64a()
		h.Write(k)
		if got, want := keyHash(k), h.Sum64(); got != want {
			t.Errorf("keyHash(%x) = %x, want %x", k, got, want)
		}
		if got, want := string(appendHex16([]byte("x"), keyHash(k))), fmt.Sprintf("x%016x", keyHash(k)); got != want {
			t.Errorf("appendHex16 = %q, want %q", got, want)
		}
	}
	if got := string(appendHex16(nil, 0xf)); got != "000000000000000f" {
		t.Errorf("appendHex16(0xf) = %q", got)
	}
}
