package couchrep_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/messages"
)

// Start a node inside your program, ask it for its supervision tree with
// the same message couchrepctl sends, kill an actor and watch the
// supervisor's restart event, then stop the node.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	dir, err := os.MkdirTemp("", "couchrep-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	cfg := couchrep.DefaultConfig()
	cfg.Couchrep.DataDir = dir
	cfg.Couchrep.HTTPBind = "127.0.0.1:0"
	node, err := couchrep.Start(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}

	reply, err := node.Request(ctx, &messages.TreeRequest{})
	if err != nil {
		log.Fatal(err)
	}
	root := reply.(*messages.TreeResponse).GetRoot()
	fmt.Println(root.GetName(), root.GetStrategy())
	for _, c := range root.GetChildren() {
		fmt.Println("  ", c.GetName())
	}

	events, _ := node.Subscribe(ctx, 64)
	if _, err := node.Request(ctx, &messages.KillRequest{Actor: "scheduler"}); err != nil {
		log.Fatal(err)
	}
	for ev := range events {
		if e, ok := ev.(*messages.SupervisorEvent); ok && e.GetKind() == messages.SupervisorEvent_KIND_CHILD_RESTARTED && e.GetChild() == "scheduler" {
			fmt.Println("restarted", e.GetChild(), "restart count", e.GetRestartCount())
			break
		}
	}

	if err := node.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// couchrep_sup STRATEGY_REST_FOR_ONE
	//    event_bus
	//    clustering
	//    connection_pool
	//    rate_limiter
	//    scheduler
	//    job_server
	//    activity_monitor
	//    doc_processor
	//    http_api
	// restarted scheduler restart count 1
}
