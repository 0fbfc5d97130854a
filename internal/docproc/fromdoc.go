package docproc

import (
	"bytes"
	"encoding/json"

	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
)

// DocEntry is the _scheduler/docs entry of a document that carries a
// terminal state, read from the document as CouchDB's
// couch_replicator:info_from_doc/2 reads it (checked on CouchDB 3.4.3):
//
//   - completed: "info" is _replication_stats without its start_time ({}
//     when there are none), "start_time" that start_time, "error_count" 0;
//   - failed: "info" is {"error": _replication_state_reason} (null without
//     a reason), "start_time" the _replication_state_time, "error_count" 1;
//   - "last_updated" is the _replication_state_time (null when absent);
//   - "source" and "target" are the endpoints' URLs without credentials
//     (replicate.ShownEndpoint).
//
// Absent values are null. It also returns the failure's reason (empty for
// none).
func DocEntry(doc json.RawMessage, state repjob.State) (entry json.RawMessage, reason string) {
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(doc, &fields)
	val := func(raw json.RawMessage) json.RawMessage {
		if len(raw) == 0 {
			return json.RawMessage("null")
		}
		return raw
	}
	e := map[string]json.RawMessage{
		"state":        mustJSON(state.String()),
		"source":       val(replicate.ShownEndpoint(fields["source"])),
		"target":       val(replicate.ShownEndpoint(fields["target"])),
		"last_updated": val(fields["_replication_state_time"]),
		"start_time":   json.RawMessage("null"),
		"info":         json.RawMessage("null"),
		"error_count":  json.RawMessage("0"),
	}
	switch state {
	case repjob.StateCompleted:
		info, start := withoutKey(fields["_replication_stats"], "start_time")
		e["info"], e["start_time"] = info, val(start)
	case repjob.StateFailed:
		e["error_count"], e["start_time"] = json.RawMessage("1"), e["last_updated"]
		if json.Unmarshal(fields["_replication_state_reason"], &reason) == nil && reason != "" {
			e["info"] = mustJSON(map[string]string{"error": reason})
		}
	}
	return mustJSON(e), reason
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		return json.RawMessage("null")
	}
	return b
}

// withoutKey returns JSON object obj without key, its other members in
// their order, and key's value (nil when absent). A value that is not an
// object gives {}.
func withoutKey(obj json.RawMessage, key string) (rest, val json.RawMessage) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return json.RawMessage("{}"), nil
	}
	var buf bytes.Buffer
	buf.WriteByte('{')
	for dec.More() {
		t, err := dec.Token()
		k, ok := t.(string)
		var v json.RawMessage
		if err != nil || !ok || dec.Decode(&v) != nil {
			return json.RawMessage("{}"), nil
		}
		if k == key {
			val = v
			continue
		}
		if buf.Len() > 1 {
			buf.WriteByte(',')
		}
		buf.Write(mustJSON(k))
		buf.WriteByte(':')
		_ = json.Compact(&buf, v)
	}
	buf.WriteByte('}')
	return buf.Bytes(), val
}
