package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/replicate"
)

func TestFormatProgress(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		name    string
		s       replicate.Stats
		elapsed time.Duration
		want    string
	}{
		{"eta", replicate.Stats{DocsRead: 210, DocsWritten: 200, ChangesPending: n(1000)}, 2 * time.Second,
			"docs read 210, written 200, pending 1000 | 100 docs/s | ETA 10s"},
		{"caught up", replicate.Stats{DocsRead: 5, DocsWritten: 5, DocWriteFailures: 1, ChangesPending: n(0)}, time.Second,
			"docs read 5, written 5, failed 1, pending 0 | 5 docs/s | caught up"},
		{"unknown pending", replicate.Stats{}, 0, "docs read 0, written 0, pending ? | 0 docs/s | ETA ?"},
		{"no rate yet", replicate.Stats{ChangesPending: n(7)}, time.Second, "docs read 0, written 0, pending 7 | 0 docs/s | ETA ?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := formatProgress(tc.s, tc.elapsed); got != tc.want {
				t.Fatalf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestProgressLineAtMostFourPerSecond feeds stats every 50 ms of a fake
// clock for 2 s: at most 4 lines a second are drawn, and the newest stats
// are drawn at the end.
func TestProgressLineAtMostFourPerSecond(t *testing.T) {
	var out bytes.Buffer
	clock := time.Unix(0, 0)
	p := &progressLine{w: &out, now: func() time.Time { return clock }, start: clock}
	for i := range 40 {
		p.report(replicate.Stats{DocsWritten: int64(i)})
		clock = clock.Add(50 * time.Millisecond)
	}
	p.finish()
	draws := strings.Count(out.String(), "\r\033[K")
	if draws < 8 || draws > 9 {
		t.Fatalf("%d lines drawn in 2 s (at most 4 a second, plus the final one)", draws)
	}
	lines := strings.Split(out.String(), "\r\033[K")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "docs read 0, written 39,") || !strings.HasSuffix(last, "\n") {
		t.Fatalf("last line %q", last)
	}
}

func TestNoProgressLineOffATerminalOrQuiet(t *testing.T) {
	var buf bytes.Buffer
	if p := newProgressLine(&buf, false); p != nil {
		t.Fatal("a progress line on a buffer (not a terminal)")
	}
	// A terminal (a pseudo-terminal's master side) gets a line, unless
	// --quiet; /dev/null, a character device but no terminal, gets none.
	tty, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("no pseudo-terminal to test with: %v", err)
	}
	defer tty.Close()
	if newProgressLine(tty, false) == nil || newProgressLine(tty, true) != nil {
		t.Fatal("a terminal gets a line unless --quiet")
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if newProgressLine(null, false) != nil {
		t.Fatal("a progress line on /dev/null")
	}
	// A nil line is a no-op.
	var p *progressLine
	p.report(replicate.Stats{})
	p.finish()
	if buf.Len() != 0 {
		t.Fatalf("wrote %q", buf.String())
	}
}
