package repjob_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/messages"
)

// TestStateNames: every state maps to its CouchDB name and back (String,
// ParseState, MarshalText, UnmarshalText, JSON), and to the stored enum
// and back; the states are exactly the stored enum's values.
func TestStateNames(t *testing.T) {
	tests := []struct {
		state    repjob.State
		name     string
		proto    messages.ReplicationState
		terminal bool
	}{
		{repjob.StatePending, "pending", messages.ReplicationState_REPLICATION_STATE_PENDING, false},
		{repjob.StateRunning, "running", messages.ReplicationState_REPLICATION_STATE_RUNNING, false},
		{repjob.StateCrashing, "crashing", messages.ReplicationState_REPLICATION_STATE_CRASHING, false},
		{repjob.StateCompleted, "completed", messages.ReplicationState_REPLICATION_STATE_COMPLETED, true},
		{repjob.StateFailed, "failed", messages.ReplicationState_REPLICATION_STATE_FAILED, true},
	}
	if len(tests) != len(repjob.States) {
		t.Fatalf("%d states, %d tested", len(repjob.States), len(tests))
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if repjob.States[i] != tc.state {
				t.Errorf("States[%d] = %s", i, repjob.States[i])
			}
			if got := tc.state.String(); got != tc.name {
				t.Errorf("String = %q", got)
			}
			if got, err := repjob.ParseState(tc.name); err != nil || got != tc.state {
				t.Errorf("ParseState(%q) = %s, %v", tc.name, got, err)
			}
			if got := tc.state.Proto(); got != tc.proto {
				t.Errorf("Proto = %s", got)
			}
			if got := repjob.State(tc.proto); got != tc.state {
				t.Errorf("State(%s) = %s", tc.proto, got)
			}
			if want := strings.ToLower(strings.TrimPrefix(tc.proto.String(), "REPLICATION_STATE_")); tc.name != want {
				t.Errorf("name %q, stored enum says %q", tc.name, want)
			}
			if got := tc.state.Terminal(); got != tc.terminal {
				t.Errorf("Terminal = %v", got)
			}
			b, err := json.Marshal(map[string]repjob.State{"state": tc.state})
			if want := `{"state":"` + tc.name + `"}`; err != nil || string(b) != want {
				t.Fatalf("JSON = %s, %v; want %s", b, err, want)
			}
			var back map[string]repjob.State
			if err := json.Unmarshal(b, &back); err != nil || back["state"] != tc.state {
				t.Errorf("JSON back = %v, %v", back, err)
			}
		})
	}
	for v := range messages.ReplicationState_name {
		st := repjob.State(v)
		if v == 0 {
			continue
		}
		if _, err := repjob.ParseState(st.String()); err != nil {
			t.Errorf("stored state %s has no name: %v", messages.ReplicationState(v), err)
		}
	}
}

// TestStateBadInput: names that are not states are refused with the name;
// the zero State is unknown (no name, empty text).
func TestStateBadInput(t *testing.T) {
	for _, name := range []string{"", "Running", "initializing", "error", "finished", "triggered"} {
		if st, err := repjob.ParseState(name); err == nil || !strings.Contains(err.Error(), `"`+name+`"`) {
			t.Errorf("ParseState(%q) = %s, %v; want an error naming it", name, st, err)
		}
	}
	var zero repjob.State
	if zero.String() != "State(0)" || zero.Terminal() {
		t.Errorf("zero State: %q terminal %v", zero.String(), zero.Terminal())
	}
	if _, err := json.Marshal(zero); err == nil {
		t.Error("marshalled the zero State")
	}
	if err := zero.UnmarshalText(nil); err != nil || zero != 0 {
		t.Errorf("UnmarshalText(empty) = %s, %v", zero, err)
	}
	var st repjob.State
	if err := json.Unmarshal([]byte(`"triggered"`), &st); err == nil {
		t.Errorf("unmarshalled %q as %s", "triggered", st)
	}
}
