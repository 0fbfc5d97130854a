package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	clog "github.com/couchrep/couchrep/internal/log"
	"github.com/couchrep/couchrep/internal/replicate"
)

// progressEvery is the shortest time between two progress lines: at most 4
// updates a second.
const progressEvery = 250 * time.Millisecond

// progressLine redraws one status line on a terminal with a replication's
// stats: docs read and written, changes pending (from _changes' pending),
// docs/s and, when pending is known, the ETA.
type progressLine struct {
	w     io.Writer
	now   func() time.Time
	start time.Time

	mu      sync.Mutex
	last    time.Time // when the line was last drawn
	drawn   bool
	pending replicate.Stats // newest stats not drawn yet
	dirty   bool
}

// newProgressLine draws on w, or returns nil when no line should be drawn:
// w is not a terminal, or quiet is set.
func newProgressLine(w io.Writer, quiet bool) *progressLine {
	if quiet || !clog.IsTerminal(w) {
		return nil
	}
	return &progressLine{w: w, now: time.Now, start: time.Now()}
}

// report is the engine's OnProgress: it draws s unless a line was drawn
// less than progressEvery ago.
func (p *progressLine) report(s replicate.Stats) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if p.drawn && now.Sub(p.last) < progressEvery {
		p.pending, p.dirty = s, true
		return
	}
	p.drawLocked(s, now)
}

func (p *progressLine) drawLocked(s replicate.Stats, now time.Time) {
	fmt.Fprintf(p.w, "\r\033[K%s", formatProgress(s, now.Sub(p.start)))
	p.last, p.drawn, p.dirty = now, true, false
}

// finish draws the newest stats if they were held back, and ends the line.
func (p *progressLine) finish() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dirty {
		p.drawLocked(p.pending, p.now())
	}
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}

// formatProgress is the progress line for s after elapsed.
func formatProgress(s replicate.Stats, elapsed time.Duration) string {
	rate := 0.0
	if sec := elapsed.Seconds(); sec > 0 {
		rate = float64(s.DocsWritten) / sec
	}
	var b strings.Builder
	fmt.Fprintf(&b, "docs read %d, written %d", s.DocsRead, s.DocsWritten)
	if s.DocWriteFailures > 0 {
		fmt.Fprintf(&b, ", failed %d", s.DocWriteFailures)
	}
	if s.ChangesPending != nil {
		fmt.Fprintf(&b, ", pending %d", *s.ChangesPending)
	} else {
		b.WriteString(", pending ?")
	}
	fmt.Fprintf(&b, " | %.0f docs/s", rate)
	switch {
	case s.ChangesPending != nil && *s.ChangesPending == 0:
		b.WriteString(" | caught up")
	case s.ChangesPending != nil && rate > 0:
		eta := time.Duration(math.Ceil(float64(*s.ChangesPending)/rate)) * time.Second
		fmt.Fprintf(&b, " | ETA %s", eta)
	default:
		b.WriteString(" | ETA ?")
	}
	return b.String()
}
