package couch

import (
	"bytes"
	"strings"
	"testing"
	"testing/iotest"
)

// TestJSONStreamBufferFollowsReads: a stream that receives a few bytes at a
// time (an idle continuous feed: heartbeats, a row now and then) holds a
// small read buffer, not jsonChunk; a stream that delivers fast grows its
// reads to jsonChunk.
func TestJSONStreamBufferFollowsReads(t *testing.T) {
	big := strings.Repeat(" ", 1<<20) + "1"
	tests := []struct {
		name    string
		stream  *jsonStream
		fills   int
		wantMax int // largest cap(buf) allowed after the fills
		wantMin int // smallest cap(buf) required
	}{
		{"heartbeats", newJSONStream(iotest.OneByteReader(strings.NewReader(strings.Repeat("\n", 100)))), 50, jsonMinChunk, 0},
		{"fast", newJSONStream(bytes.NewReader([]byte(big))), 10, jsonChunk, jsonChunk},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for range tc.fills {
				if !tc.stream.fill(len(tc.stream.buf)) {
					t.Fatal("stream ended early")
				}
			}
			if c := cap(tc.stream.buf); c > tc.wantMax || c < tc.wantMin {
				t.Fatalf("read buffer %d bytes after %d fills, want %d..%d", c, tc.fills, tc.wantMin, tc.wantMax)
			}
		})
	}
}
