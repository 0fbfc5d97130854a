package schedpolicy_test

import (
	"testing"

	"github.com/couchrep/couchrep/internal/schedpolicy"
)

// TestAcceptShare: a node's share of the pending jobs levels what the live
// nodes hold, within their free slots; alone it takes everything.
func TestAcceptShare(t *testing.T) {
	free := func(held int) schedpolicy.Load { return schedpolicy.Load{Held: held, Free: 1000} }
	tests := []struct {
		name    string
		pending int
		self    schedpolicy.Load
		peers   []schedpolicy.Load
		want    int
	}{
		{"alone: everything", 60, free(0), nil, 60},
		{"alone, few slots: everything (the loop's batch bounds it)", 60, schedpolicy.Load{Free: 5}, nil, 60},
		{"nothing pending", 0, free(0), []schedpolicy.Load{free(0)}, 0},
		{"three empty nodes: a third", 60, free(0), []schedpolicy.Load{free(0), free(0)}, 20},
		{"three nodes, a remainder: the level rounds up", 61, free(0), []schedpolicy.Load{free(0), free(0)}, 21},
		{"self first to accept after a one-job accept each", 57, free(1), []schedpolicy.Load{free(1), free(1)}, 19},
		{"self holds its part already", 20, free(20), []schedpolicy.Load{free(0), free(20)}, 0},
		{"self behind: it catches up first", 30, free(0), []schedpolicy.Load{free(20), free(20)}, 24},
		{"stale peers (they accepted since): self takes less, not more", 40, free(20), []schedpolicy.Load{free(0), free(0)}, 0},
		{"a dead node's jobs spread over the survivors", 20, free(20), []schedpolicy.Load{free(20)}, 10},
		{"a full peer: its part goes to the others", 60, free(0), []schedpolicy.Load{{Held: 10, Free: 0}, free(0)}, 30},
		{"a peer with few slots left: the rest to the others", 60, free(0), []schedpolicy.Load{{Held: 0, Free: 4}, free(0)}, 28},
		{"not all fit: self takes all it can", 100, schedpolicy.Load{Free: 10}, []schedpolicy.Load{{Free: 10}}, 10},
		{"self full", 60, schedpolicy.Load{Held: 5, Free: 0}, []schedpolicy.Load{free(0)}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := schedpolicy.AcceptShare(tc.pending, tc.self, tc.peers); got != tc.want {
				t.Errorf("AcceptShare(%d, %+v, %+v) = %d, want %d", tc.pending, tc.self, tc.peers, got, tc.want)
			}
		})
	}
}
