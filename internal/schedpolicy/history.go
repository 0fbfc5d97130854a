package schedpolicy

import (
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/messages"
)

// EventType is the kind of a history event.
type EventType int

// The event types of CouchDB's scheduler history.
const (
	EventAdded EventType = iota + 1
	EventStarted
	EventStopped
	EventCrashed
)

// String returns the name used in _scheduler/jobs ("added", ...).
func (t EventType) String() string {
	switch t {
	case EventAdded:
		return "added"
	case EventStarted:
		return "started"
	case EventStopped:
		return "stopped"
	case EventCrashed:
		return "crashed"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event is one history entry.
type Event struct {
	Type EventType
	At   time.Time
	// Reason says why the job crashed (EventCrashed only).
	Reason string
}

// History is a job's events, newest first, as CouchDB keeps them. It is a
// value: Append returns a new History and never changes its receiver's
// elements.
type History []Event

// NewHistory is the history of a job added at now.
func NewHistory(now time.Time) History {
	return History{{Type: EventAdded, At: now}}
}

// Append returns h with e as its newest event, truncated to max events
// (max <= 0 keeps everything).
func (h History) Append(e Event, max int) History {
	n := len(h) + 1
	if max > 0 && n > max {
		n = max
	}
	out := make(History, n)
	out[0] = e
	copy(out[1:], h)
	return out
}

// ConsecutiveCrashes counts the job's consecutive crashes exactly as
// CouchDB's consecutive_crashes/2: walking from the newest event, each crash
// that came within threshold of the event before it counts; a crash more
// than threshold after the event before it (the job ran long enough to be
// healthy) or a "stopped" right after a "started" ends the streak. It is the
// error_count of _scheduler/docs.
func (h History) ConsecutiveCrashes(threshold time.Duration) int {
	count := 0
	for i := 0; i < len(h); i++ {
		switch {
		case h[i].Type == EventCrashed && i+1 < len(h):
			if h[i].At.Sub(h[i+1].At) > threshold {
				return count
			}
			count++
		case h[i].Type == EventStopped && i+1 < len(h) && h[i+1].Type == EventStarted:
			return count
		}
	}
	return count
}

// LatestCrash returns the newest crash event.
func (h History) LatestCrash() (Event, bool) {
	for _, e := range h {
		if e.Type == EventCrashed {
			return e, true
		}
	}
	return Event{}, false
}

// LastStarted returns when the job last started (zero if never), the
// tie-breaker of CouchDB's start and stop orders.
func (h History) LastStarted() time.Time {
	for _, e := range h {
		if e.Type == EventStarted {
			return e.At
		}
	}
	return time.Time{}
}

// LastUpdated returns the time of the newest event (zero if none).
func (h History) LastUpdated() time.Time {
	if len(h) == 0 {
		return time.Time{}
	}
	return h[0].At
}

// BackoffUntil returns when the job may run again: zero unless its newest
// event is a crash, else that crash's time plus p.Backoff of its
// consecutive crashes, at least MinBackoff (a crash of a healed job).
func (h History) BackoffUntil(p Policy) time.Time {
	if len(h) == 0 || h[0].Type != EventCrashed {
		return time.Time{}
	}
	n := max(h.ConsecutiveCrashes(p.HealthThreshold), 1)
	return h[0].At.Add(p.Backoff(n))
}

type eventJSON struct {
	Timestamp string `json:"timestamp"`
	Type      string `json:"type"`
	Reason    string `json:"reason,omitempty"`
}

// ISO8601 formats t as CouchDB's couch_replicator_utils:iso8601
// ("2017-04-05T20:55:10Z").
func ISO8601(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05Z")
}

// MarshalJSON renders the history as _scheduler/jobs does:
// [{"timestamp":"2017-04-05T20:55:10Z","type":"crashed","reason":"..."}].
func (h History) MarshalJSON() ([]byte, error) {
	out := make([]eventJSON, len(h))
	for i, e := range h {
		out[i] = eventJSON{Timestamp: ISO8601(e.At), Type: e.Type.String()}
		if e.Type == EventCrashed {
			out[i].Reason = e.Reason
		}
	}
	return json.Marshal(out)
}

var eventTypeToProto = map[EventType]messages.JobEventType{
	EventAdded:   messages.JobEventType_JOB_EVENT_TYPE_ADDED,
	EventStarted: messages.JobEventType_JOB_EVENT_TYPE_STARTED,
	EventStopped: messages.JobEventType_JOB_EVENT_TYPE_STOPPED,
	EventCrashed: messages.JobEventType_JOB_EVENT_TYPE_CRASHED,
}

// Proto is the history as a stored record.
func (h History) Proto() *messages.JobHistory {
	m := &messages.JobHistory{Events: make([]*messages.JobEvent, len(h))}
	for i, e := range h {
		m.Events[i] = &messages.JobEvent{
			Type:      eventTypeToProto[e.Type],
			Timestamp: timestamppb.New(e.At),
			Reason:    e.Reason,
		}
	}
	return m
}

// HistoryFromProto decodes a stored history; events of an unknown type are
// skipped.
func HistoryFromProto(m *messages.JobHistory) History {
	h := make(History, 0, len(m.GetEvents()))
	for _, pe := range m.GetEvents() {
		var t EventType
		for k, v := range eventTypeToProto {
			if v == pe.GetType() {
				t = k
			}
		}
		if t == 0 {
			continue
		}
		h = append(h, Event{Type: t, At: pe.GetTimestamp().AsTime(), Reason: pe.GetReason()})
	}
	return h
}
