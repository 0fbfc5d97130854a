package clustering_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/cluster"
	"github.com/couchrep/couchrep/supervisor"
)

// TestNameTakenOverStopsTheNode: when another process claims the node's
// name (its lease looked expired), the clustering actor stops heartbeating
// over the new holder's record: it exits with ErrNameTaken, its restarts
// fail alike, and the supervisor gives up; a node whose name another
// process already holds does not start at all.
func TestNameTakenOverStopsTheNode(t *testing.T) {
	db := openStore(t)
	m, err := startMember(t, db, "n1", "replication")
	if err != nil {
		t.Fatal(err)
	}
	// Seen from a clock past the lease, the record is expired: the claim
	// succeeds as it would for a node started after a long pause of n1.
	late := cluster.New(db, cluster.Options{Clock: func() time.Time { return time.Now().Add(time.Hour) }})
	other := cluster.Owner{Host: "elsewhere", DataDir: "/other", PID: 1}
	if _, err := late.Claim(t.Context(), "n1", other, time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.sup.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the node still runs 30 s after its name was taken over")
	}
	// The supervisor's escalation says its last child error in words.
	if err := m.sup.Err(); !errors.Is(err, supervisor.ErrEscalated) || !strings.Contains(err.Error(), cluster.ErrNameTaken.Error()+": pid 1 on host elsewhere") {
		t.Fatalf("supervisor stopped with %v, want an escalation after ErrNameTaken naming the new holder", err)
	}
	if o, _, err := cluster.New(db, cluster.Options{}).Owner(t.Context(), "n1"); err != nil || o != other {
		t.Fatalf("owner %+v, %v; want the new holder", o, err)
	}

	_, err = startMember(t, db, "n1", "replication")
	if err == nil || !strings.Contains(err.Error(), cluster.ErrNameTaken.Error()) {
		t.Fatalf("start under a name another process holds: %v, want a failure naming the takeover", err)
	}
}
