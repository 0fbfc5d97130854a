package schedpolicy

import (
	"fmt"
	"time"
)

// State is a job's state as _scheduler/docs shows it.
type State int

// Job states, as CouchDB's job_summary and the FoundationDB-era replicator.
const (
	StatePending State = iota + 1
	StateRunning
	StateCrashing
	StateCompleted
	StateFailed
)

// String returns the state's JSON name ("pending", ...).
func (s State) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateRunning:
		return "running"
	case StateCrashing:
		return "crashing"
	case StateCompleted:
		return "completed"
	case StateFailed:
		return "failed"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Summary is what _scheduler/docs shows of a job's scheduling state.
type Summary struct {
	State State
	// ErrorCount is the number of consecutive crashes.
	ErrorCount int
	// Error is the newest crash reason when State is StateCrashing.
	Error string
	// LastUpdated is the time of the newest event.
	LastUpdated time.Time
}

// Summarize maps a job to CouchDB's job_summary: a terminal state (final is
// StateCompleted or StateFailed) wins; a running job is running; a job
// whose newest event is a crash, or that has consecutive crashes, is
// crashing; anything else is pending.
func Summarize(h History, running bool, final State, healthThreshold time.Duration) Summary {
	s := Summary{
		ErrorCount:  h.ConsecutiveCrashes(healthThreshold),
		LastUpdated: h.LastUpdated(),
	}
	switch {
	case final == StateCompleted || final == StateFailed:
		s.State = final
	case running:
		s.State = StateRunning
	case s.ErrorCount > 0 || (len(h) > 0 && h[0].Type == EventCrashed):
		s.State = StateCrashing
		if e, ok := h.LatestCrash(); ok {
			s.Error = e.Reason
		}
	default:
		s.State = StatePending
	}
	return s
}
