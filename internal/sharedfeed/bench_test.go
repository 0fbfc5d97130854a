package sharedfeed

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/mango"
)

// BenchmarkFanOut measures one feed with 10,000 per-user selector members
// ({"owner": "u<i>"}, the fan-out of a central database): the heap each
// member holds (its compiled selector included: B/member, after a GC),
// and the CPU to fan one row out (ns/op: decode the row's document once,
// evaluate 10,000 selectors, hand the row to the one that matches).
// Subscriptions and watches (parked jobs) alike; equality selectors are
// indexed by their value, "unindexed" ones ($in) are each evaluated.
func BenchmarkFanOut(b *testing.B) {
	const n = 10000
	for _, bc := range []struct{ name, sel string }{
		{"subscriptions", `{"owner": "u%d"}`},
		{"watches", `{"owner": "u%d"}`},
		{"subscriptions-unindexed", `{"owner": {"$in": ["u%d"]}}`},
	} {
		kind := bc.name
		b.Run(kind, func(b *testing.B) {
			h := New(Options{})
			f := h.newFeed(Source{Key: "k", Name: "central"})
			defer f.cancel()
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			before := ms.HeapAlloc
			members := make([]*Subscription, n)
			for i := range members {
				sel, err := mango.Parse(fmt.Appendf(nil, bc.sel, i))
				if err != nil {
					b.Fatal(err)
				}
				members[i] = h.member(Filter{Selector: sel}, kind == "watches")
				f.add(members[i])
			}
			runtime.GC()
			runtime.ReadMemStats(&ms)
			perMember := float64(ms.HeapAlloc-before) / n
			row := couch.Change{Seq: couch.Seq(`"7-x"`), ID: "note:123", Revs: []string{"3-abc"},
				Doc: []byte(`{"_id":"note:123","_rev":"3-abc","owner":"u4321","type":"note","title":"groceries","items":["milk","bread"],"done":false}`)}
			target := members[4321]
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				f.dispatch(row)
				target.mu.Lock()
				target.rows = target.rows[:0]
				target.mu.Unlock()
				select {
				case <-target.wake:
				default:
					b.Fatal("the matching member was not woken")
				}
			}
			b.StopTimer()
			b.ReportMetric(perMember, "B/member")
			runtime.KeepAlive(members)
		})
	}
}
