package connpool_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors/connpool"
	"github.com/couchrep/couchrep/supervisor"
)

// A job acquires a lease once, sends its requests through the lease's
// client, and loses the lease when it dies.
func Example() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"db_name":"db"}`)
	}))
	defer srv.Close()
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	ctx := context.Background()
	sup, err := supervisor.Start(ctx, system, "node", supervisor.Spec{
		Strategy: supervisor.OneForOne, MaxRestarts: 10, Period: time.Second,
		Children: []supervisor.ChildSpec{{Name: connpool.Name, Props: connpool.Props(connpool.Config{Logger: zerolog.Nop()})}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = sup.Stop(ctx) }()
	pool := connpool.At(system, actor.NewPID(system.Address(), "node/"+connpool.Name))

	job, _ := system.Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), "job")
	lease, err := pool.Acquire(ctx, job, 20) // http_connections = 20
	if err != nil {
		fmt.Println(err)
		return
	}
	resp, err := lease.Client().Get(srv.URL + "/db")
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body))

	_ = system.Root.StopFuture(job).Wait() // the job dies
	<-lease.Done()
	fmt.Println("reclaimed:", errors.Is(lease.Err(), connpool.ErrOwnerDied))
	// Output:
	// 200 {"db_name":"db"}
	// reclaimed: true
}
