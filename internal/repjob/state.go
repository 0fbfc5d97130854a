package repjob

import (
	"fmt"

	"github.com/couchrep/couchrep/messages"
)

// State is a replication job's state, the one state type of a job: what
// _scheduler/jobs, _scheduler/docs, _replicator documents and couchrepctl
// show. Its numbers are those of messages.ReplicationState, the form the
// stored record and the job events carry (State(m.GetState()), s.Proto());
// its text is CouchDB's name (String, MarshalText, ParseState); the admin
// API's messages.JobStatus maps to it in internal/admin. The queue's own
// states (jobqueue.State: pending, running, finished) are not job states:
// Record.State derives a job's state from both.
type State messages.ReplicationState

// A replication job's states. The zero State is no state ("unknown").
const (
	// StatePending: waiting in the queue (new, stopped by rotation or by
	// a node going away, or its replication id changed).
	StatePending = State(messages.ReplicationState_REPLICATION_STATE_PENDING)
	// StateRunning: accepted by a node and running.
	StateRunning = State(messages.ReplicationState_REPLICATION_STATE_RUNNING)
	// StateCrashing: crashed; waiting for its backoff to run again.
	StateCrashing = State(messages.ReplicationState_REPLICATION_STATE_CRASHING)
	// StateCompleted: a one-shot replication reached the end of its
	// changes feed. Terminal.
	StateCompleted = State(messages.ReplicationState_REPLICATION_STATE_COMPLETED)
	// StateFailed: failed for good (invalid parameters, a duplicate
	// persistent job, ...). Terminal.
	StateFailed = State(messages.ReplicationState_REPLICATION_STATE_FAILED)
)

// States are every state, in the enum's order.
var States = []State{StatePending, StateRunning, StateCrashing, StateCompleted, StateFailed}

var stateNames = map[State]string{
	StatePending:   "pending",
	StateRunning:   "running",
	StateCrashing:  "crashing",
	StateCompleted: "completed",
	StateFailed:    "failed",
}

// String returns CouchDB's name of the state ("running"), or "State(n)"
// for a value that is not a state.
func (s State) String() string {
	if n, ok := stateNames[s]; ok {
		return n
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// ParseState returns the state CouchDB names name; an error for any other
// name (CouchDB 2.x's "initializing" and "error" are not couchrep states).
func ParseState(name string) (State, error) {
	for s, n := range stateNames {
		if n == name {
			return s, nil
		}
	}
	return 0, fmt.Errorf("repjob: unknown replication state %q", name)
}

// Terminal reports whether s is completed or failed: a job that runs no
// more and whose state is written back to its _replicator document.
func (s State) Terminal() bool { return s == StateCompleted || s == StateFailed }

// Proto returns s as the stored record and the job events carry it.
func (s State) Proto() messages.ReplicationState { return messages.ReplicationState(s) }

// MarshalText encodes s as its CouchDB name, so that JSON shows "running".
func (s State) MarshalText() ([]byte, error) {
	n, ok := stateNames[s]
	if !ok {
		return nil, fmt.Errorf("repjob: marshal %s: not a replication state", s)
	}
	return []byte(n), nil
}

// UnmarshalText decodes a CouchDB name (ParseState); empty text is the zero
// State.
func (s *State) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*s = 0
		return nil
	}
	st, err := ParseState(string(b))
	if err != nil {
		return err
	}
	*s = st
	return nil
}
