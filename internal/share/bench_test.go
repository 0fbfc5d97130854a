package share_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/share"
)

// BenchmarkLedger measures the O(1) operations: an enqueue (deadline for a
// job) and a charge, over 1,000 keys, with debt decay on.
func BenchmarkLedger(b *testing.B) {
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("db%04d/_replicator", i)
	}
	for _, op := range []string{"Enqueue", "Charge"} {
		b.Run(op, func(b *testing.B) {
			l := share.NewLedger(share.Params{})
			now := t0
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				k := keys[i%len(keys)]
				now = now.Add(time.Millisecond)
				if op == "Enqueue" {
					l.Accepted(l.Enqueue(k, now) / 2)
				} else {
					l.Charge(k, time.Second, now)
				}
				i++
			}
		})
	}
}
