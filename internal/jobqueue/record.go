package jobqueue

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/messages"
)

var marshalOpts = proto.MarshalOptions{Deterministic: true}

func marshal(m proto.Message) ([]byte, error) {
	b, err := marshalOpts.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("jobqueue: encode %T: %w", m, err)
	}
	return b, nil
}

func unmarshal(b []byte, m proto.Message) (err error) {
	defer func() {
		// The protobuf runtime does not panic on bad input, but a stored
		// record must never take the process down.
		if r := recover(); r != nil {
			err = fmt.Errorf("decode panicked: %v", r)
		}
	}()
	return proto.Unmarshal(b, m)
}

func tsTime(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

func timeTS(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// stampPlaceholder fills activity_stamp before the record is written as a
// versionstamped value; the store overwrites it at commit.
var stampPlaceholder = bytes.Repeat([]byte{0xAB}, kv.VersionstampLength)

// activityStampOffset is where activity_stamp's bytes start in an encoded
// record: field 1, wire type 2 (tag 0x0a), length 10 (0x0a).
const activityStampOffset = 2

// loadRecord reads the job record at (type, id) with a read conflict. It
// returns (nil, nil) if the job does not exist and an error wrapping
// ErrCorrupt if it cannot be decoded.
func (q *Queue) loadRecord(tx kv.ReadTx, typ, id string) (*messages.JobRecord, error) {
	v, err := tx.Get(q.keys.dataKey(typ, id))
	if err != nil {
		return nil, fmt.Errorf("jobqueue: read job %q/%q: %w", typ, id, err)
	}
	if v == nil {
		return nil, nil
	}
	return decodeRecord(typ, id, v)
}

func decodeRecord(typ, id string, v []byte) (*messages.JobRecord, error) {
	rec := &messages.JobRecord{}
	if err := unmarshal(v, rec); err != nil {
		return nil, fmt.Errorf("%w: job %q/%q: %v", ErrCorrupt, typ, id, err)
	}
	if rec.GetId() != id || rec.GetType() != typ {
		return nil, fmt.Errorf("%w: job %q/%q: record names job %q/%q", ErrCorrupt, typ, id, rec.GetType(), rec.GetId())
	}
	switch rec.GetState() {
	case messages.JobState_JOB_STATE_PENDING, messages.JobState_JOB_STATE_FINISHED:
	case messages.JobState_JOB_STATE_RUNNING:
		if len(rec.GetWorkerLock()) != lockLength || len(rec.GetActivityStamp()) != kv.VersionstampLength {
			return nil, fmt.Errorf("%w: job %q/%q: running without a valid lock or activity stamp", ErrCorrupt, typ, id)
		}
	default:
		return nil, fmt.Errorf("%w: job %q/%q: unknown state %d", ErrCorrupt, typ, id, rec.GetState())
	}
	return rec, nil
}

// storeRecord writes rec (not running). It bumps rec.Version.
func (q *Queue) storeRecord(tx kv.Tx, rec *messages.JobRecord) error {
	rec.ActivityStamp = nil
	return q.storeKeepStamp(tx, rec)
}

// storeKeepStamp rewrites rec keeping its activity stamp (and so a running
// job's activity entry): for changes that are not worker activity. It bumps
// rec.Version.
func (q *Queue) storeKeepStamp(tx kv.Tx, rec *messages.JobRecord) error {
	rec.Version++
	v, err := marshal(rec)
	if err != nil {
		return err
	}
	tx.Set(q.keys.dataKey(rec.GetType(), rec.GetId()), v)
	q.bumpGeneration(tx, rec.GetType(), rec.GetId())
	return nil
}

// bumpGeneration records in tx that job (typ, id)'s record changed (see
// Generation). An atomic add: it adds no conflict.
func (q *Queue) bumpGeneration(tx kv.Tx, typ, id string) {
	tx.Add(q.keys.generationKey(typ, id), 1)
}

// storeRunning writes rec as running: the record carries this
// transaction's versionstamp as its activity stamp and a new activity entry
// is written under the same stamp.
// The caller must have cleared the job's previous activity entry.
func (q *Queue) storeRunning(tx kv.Tx, rec *messages.JobRecord) error {
	rec.Version++
	rec.ActivityStamp = stampPlaceholder
	v, err := marshal(rec)
	if err != nil {
		return err
	}
	if len(v) < activityStampOffset+kv.VersionstampLength ||
		v[0] != 0x0a || v[1] != byte(kv.VersionstampLength) ||
		!bytes.Equal(v[activityStampOffset:activityStampOffset+kv.VersionstampLength], stampPlaceholder) {
		return fmt.Errorf("jobqueue: encoded record does not start with activity_stamp (protobuf field order changed?)")
	}
	typ, id := rec.GetType(), rec.GetId()
	if err := tx.SetVersionstampedValue(q.keys.dataKey(typ, id), v, activityStampOffset); err != nil {
		return fmt.Errorf("jobqueue: write job %q/%q: %w", typ, id, err)
	}
	q.bumpGeneration(tx, typ, id)
	key, off, err := q.keys.activityKeyIncomplete(typ, id)
	if err != nil {
		return err
	}
	if err := tx.SetVersionstampedKey(key, off, nil); err != nil {
		return fmt.Errorf("jobqueue: write activity of %q/%q: %w", typ, id, err)
	}
	return nil
}

// clearActivity removes the activity entry of a running record.
func (q *Queue) clearActivity(tx kv.Tx, rec *messages.JobRecord) {
	if len(rec.GetActivityStamp()) == kv.VersionstampLength {
		tx.Clear(q.keys.activityKey(rec.GetType(), [kv.VersionstampLength]byte(rec.GetActivityStamp()), rec.GetId()))
	}
}

// enqueue writes the pending index entry of a pending record (READY if its
// scheduled time has come, DELAYED otherwise) and bumps the pending watch.
func (q *Queue) enqueue(tx kv.Tx, rec *messages.JobRecord, now time.Time) {
	typ, id := rec.GetType(), rec.GetId()
	sched := tsTime(rec.GetScheduledAt())
	if sched.After(now) {
		tx.Set(q.keys.delayedKey(typ, sched, id), nil)
	} else {
		tx.Set(q.keys.readyKey(typ, rec.GetPriority(), id), nil)
	}
	tx.Add(q.keys.pendingWatchKey(typ), 1)
}

// dequeue clears the pending index entries a pending record may have.
func (q *Queue) dequeue(tx kv.Tx, rec *messages.JobRecord) {
	typ, id := rec.GetType(), rec.GetId()
	tx.Clear(q.keys.readyKey(typ, rec.GetPriority(), id))
	if ts := rec.GetScheduledAt(); ts != nil {
		tx.Clear(q.keys.delayedKey(typ, ts.AsTime(), id))
	}
}

// entryRecord parses index entry key of job type typ (a pending, delayed or
// activity entry, as index says) with parse, reads the record it points at
// and clears the entry: the caller consumes it either way. An entry that
// does not parse is dropped and a corrupt record left in place for an
// operator (marked so); both return a nil record, as a missing one does, so
// that the entry is not picked again and again.
func entryRecord[T any](q *Queue, tx kv.Tx, typ, index string, key []byte, parse func([]byte) (T, string, error)) (T, *messages.JobRecord, error) {
	v, id, err := parse(key)
	if err != nil {
		q.log.Error().Err(err).Str("type", typ).Msgf("dropping unparsable %s entry", index)
		tx.Clear(key)
		return v, nil, nil
	}
	rec, err := q.loadRecord(tx, typ, id)
	if errors.Is(err, ErrCorrupt) {
		q.markCorrupt(tx, typ, id, err)
		rec, err = nil, nil
	}
	if err != nil {
		return v, nil, err
	}
	tx.Clear(key)
	return v, rec, nil
}

// markCorrupt records that (type, id) failed to decode, for operators.
func (q *Queue) markCorrupt(tx kv.Tx, typ, id string, err error) {
	tx.Set(q.keys.corruptKey(typ, id), nil)
	q.log.Error().Err(err).Str("type", typ).Str("job", id).Msg("corrupt job record left in place")
}
