package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/couchrep/couchrep/supervisor"
)

// greeter prints when it starts and stops.
type greeter struct{ name string }

func (g *greeter) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Started:
		fmt.Println("start", g.name)
	case *actor.Stopping:
		fmt.Println("stop", g.name)
	case string: // any string message is a fatal error
		supervisor.Exit(ctx, errors.New(ctx.Message().(string)))
	}
}

func greeterProps(name string) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &greeter{name: name} })
}

func quietSystem() *actor.ActorSystem {
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
}

// Start a tree, lose a child, watch rest_for_one restart it and the
// children after it, then stop the tree in reverse order.
func Example() {
	system := quietSystem()
	ctx := context.Background()

	restarted := make(chan string, 10)
	sub := system.EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(*supervisor.Event); ok && e.Kind == supervisor.ChildRestarted {
			restarted <- e.Child
		}
	})
	defer system.EventStream.Unsubscribe(sub)

	sup, err := supervisor.Start(ctx, system, "app", supervisor.Spec{
		Strategy:    supervisor.RestForOne,
		MaxRestarts: 3,
		Period:      time.Minute,
		Children: []supervisor.ChildSpec{
			{Name: "db", Props: greeterProps("db")},
			{Name: "cache", Props: greeterProps("cache")},
			{Name: "api", Props: greeterProps("api")},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	fmt.Println("-- cache fails")
	system.Root.Send(actor.NewPID("nonhost", "app/cache"), "out of memory")
	first, second := <-restarted, <-restarted // the heal is complete
	fmt.Println("restarted", first, second)

	fmt.Println("-- stop")
	if err := sup.Stop(ctx); err != nil {
		fmt.Println(err)
	}
	// Output:
	// start db
	// start cache
	// start api
	// -- cache fails
	// stop cache
	// stop api
	// start cache
	// start api
	// restarted cache api
	// -- stop
	// stop api
	// stop cache
	// stop db
}

// Dynamic children: a simple_one_for_one supervisor of temporary jobs.
func ExampleStartChild() {
	system := quietSystem()
	ctx := context.Background()
	sup, err := supervisor.Start(ctx, system, "jobs", supervisor.Spec{
		Strategy: supervisor.SimpleOneForOne,
		Children: []supervisor.ChildSpec{{Name: "job", Restart: supervisor.Temporary}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, name := range []string{"job-1", "job-2"} {
		pid, err := supervisor.StartChild(ctx, system, sup.PID(), name, greeterProps(name))
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("started", pid.Id)
	}
	if err := supervisor.TerminateChild(ctx, system, sup.PID(), "job-1"); err != nil {
		fmt.Println(err)
	}
	tree, err := supervisor.Which(ctx, system, sup.PID())
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, c := range tree.Children {
		fmt.Println("running:", c.Name, c.State)
	}
	_ = sup.Stop(ctx)
	// Output:
	// start job-1
	// started jobs/job-1
	// start job-2
	// started jobs/job-2
	// stop job-1
	// running: job-2 running
	// stop job-2
}

// A supervisor that restarts too often gives up; at the top, Err says so.
func ExampleSupervisor_Err() {
	system := quietSystem()
	ctx := context.Background()
	sup, err := supervisor.Start(ctx, system, "fragile", supervisor.Spec{
		Strategy:    supervisor.OneForOne,
		MaxRestarts: 0, // no restart allowed
		Period:      time.Minute,
		Children:    []supervisor.ChildSpec{{Name: "w", Props: greeterProps("w")}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := supervisor.Kill(ctx, system, actor.NewPID("nonhost", "fragile/w"), "chaos"); err != nil {
		fmt.Println(err)
	}
	<-sup.Done()
	fmt.Println(errors.Is(sup.Err(), supervisor.ErrEscalated))
	fmt.Println(sup.Err())
	// Output:
	// start w
	// stop w
	// true
	// supervisor: escalated: fragile: shutdown: reached max restart intensity (last: w: killed: chaos)
}
