package jobqueue

import (
	"testing"
	"unsafe"
)

// TestDropData: a job that drops its data (a parked replication) keeps its
// info without it, and that info's strings are the job's and the queue's
// own, not copies of the record's (fewer objects per parked job).
func TestDropData(t *testing.T) {
	b := setup(t, Options{})
	mustAdd(t, b, "a", AddOptions{Data: []byte("payload")})
	j, err := b.q.Accept(b.ctx, typA, AcceptOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A write reads the record back: its strings are the decode's.
	if err := j.Update(b.ctx, []byte("payload 2")); err != nil {
		t.Fatal(err)
	}
	before := *j.Info()
	j.DropData()
	info := j.Info()
	if info.Data != nil {
		t.Fatalf("data kept: %q", info.Data)
	}
	if info.ID != "a" || info.Type != typA || info.WorkerNode != "node1" || info.AcceptCount != before.AcceptCount ||
		info.Priority != before.Priority || info.State != before.State {
		t.Fatalf("info changed beyond its data: %+v, was %+v", *info, before)
	}
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	if !same(info.ID, j.id) || !same(info.Type, j.typ) || !same(info.WorkerNode, b.q.node) {
		t.Fatal("the dropped info keeps strings of its own")
	}
	// The next call on the job has it all again.
	if err := j.Update(b.ctx, []byte("payload 3")); err != nil {
		t.Fatal(err)
	}
	if got := j.Info(); string(got.Data) != "payload 3" || got.AcceptCount != before.AcceptCount || got.Version <= before.Version {
		t.Fatalf("info after the next update: %+v", *got)
	}
}
