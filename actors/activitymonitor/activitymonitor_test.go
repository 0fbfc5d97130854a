package activitymonitor_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/activitymonitor"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// TestSilentJobRequeuedDespiteRestarts: a job whose worker went silent is
// re-enqueued even when the monitor actor restarts more often than the
// activity timeout (regression: each restart used to forget the activity
// samples, so a killed node's jobs waited an extra timeout per restart).
func TestSilentJobRequeuedDespiteRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for an activity timeout")
	}
	const timeout = time.Second
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "m.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	q := jobqueue.New(db, jobqueue.Options{NodeName: "dead-node"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := q.SetTypeTimeout(ctx, "t", timeout); err != nil {
		t.Fatal(err)
	}
	if err := q.Add(ctx, "t", "job", jobqueue.AddOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Accept(ctx, "t", jobqueue.AcceptOptions{}); err != nil { // its worker never updates it
		t.Fatal(err)
	}

	system := actor.NewActorSystem()
	defer system.Shutdown()
	sup, err := supervisor.Start(ctx, system, "couchrep_sup", supervisor.Spec{
		Strategy: supervisor.OneForOne, MaxRestarts: 1000, Period: time.Second,
		Children: []supervisor.ChildSpec{{Name: activitymonitor.Name,
			Props: activitymonitor.Props(q, nil, zerolog.Nop(), jobqueue.MonitorOptions{Interval: 50 * time.Millisecond})}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sup.Stop(context.Background()) }()

	// Restart the monitor every timeout/4 until the job is re-enqueued.
	done := make(chan struct{})
	killed := make(chan int)
	go func() {
		n := 0
		defer func() { killed <- n }()
		pid := actor.NewPID(system.Address(), "couchrep_sup/"+activitymonitor.Name)
		tick := time.NewTicker(timeout / 4)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if _, err := system.Root.RequestFuture(pid, &actors.Ask{Msg: &messages.KillRequest{Reason: "test"}}, 5*time.Second).Result(); err == nil {
					n++
				}
			}
		}
	}()
	info, err := q.WaitState(ctx, "t", "job", jobqueue.StatePending)
	close(done)
	n := <-killed
	if err != nil {
		t.Fatalf("job never re-enqueued while the monitor was restarted %d times: %v", n, err)
	}
	if info.TimeoutCount != 1 {
		t.Fatalf("timeout count %d", info.TimeoutCount)
	}
	if n < 2 {
		t.Fatalf("only %d restarts before the re-enqueue: the test did not exercise restarts", n)
	}
}
