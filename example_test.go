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

// Two nodes in one program share one job store, as couchrepd processes
// share one store file: a replication added through one node is a job every
// node sees, and whichever node has a free slot runs it.
func ExampleOpenStore() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "couchrep-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	store, err := couchrep.OpenStore(ctx, dir+"/jobs.db")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	var nodes []*couchrep.Node
	for _, name := range []string{"a", "b"} {
		cfg := couchrep.DefaultConfig()
		cfg.Couchrep.DataDir = dir + "/" + name
		cfg.Couchrep.NodeName = name
		cfg.CouchDB.UUID = "0f1e2d3c4b5a69788796a5b4c3d2e1f0" // nodes sharing a store share the uuid
		cfg.Couchrep.NodeTypes = []string{"replication"}      // no HTTP API
		node, err := couchrep.Start(ctx, cfg, couchrep.WithStore(store))
		if err != nil {
			log.Fatal(err)
		}
		nodes = append(nodes, node)
	}

	reply, err := nodes[0].Request(ctx, &messages.ReplicateRequest{
		Body: `{"source": "http://127.0.0.1:1/unreachable", "target": "http://127.0.0.1:1/target", "continuous": true}`,
	})
	if err != nil {
		log.Fatal(err)
	}
	id := reply.(*messages.ReplicateResponse).GetId()
	seen, err := nodes[1].Request(ctx, &messages.GetJobRequest{Id: id})
	if err != nil {
		log.Fatal(err)
	}
	job := seen.(*messages.GetJobResponse).GetJob()
	fmt.Println("node b sees the job of", job.GetSource(), "continuous:", job.GetContinuous())

	for _, node := range nodes {
		if err := node.Stop(ctx); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// node b sees the job of http://127.0.0.1:1/unreachable/ continuous: true
}
