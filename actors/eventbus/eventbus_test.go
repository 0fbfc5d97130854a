package eventbus_test

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/actors/eventbus"
	"github.com/couchrep/couchrep/messages"
)

// collector forwards what it receives to a channel.
type collector struct{ got chan proto.Message }

func (c *collector) Receive(ctx actor.Context) {
	if m, ok := ctx.Message().(proto.Message); ok {
		c.got <- m
	}
}

func TestBusDeliversSubscribedTypesAndDropsDeadSubscribers(t *testing.T) {
	system := actor.NewActorSystem()
	defer system.Shutdown()
	bus := system.Root.Spawn(eventbus.Props(nil))
	defer system.Root.Stop(bus)

	all := &collector{got: make(chan proto.Message, 16)}
	allPID := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return all }))
	kills := &collector{got: make(chan proto.Message, 16)}
	killsPID := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return kills }))

	subscribe := func(pid *actor.PID, types ...proto.Message) {
		t.Helper()
		s := &eventbus.Subscribe{PID: pid}
		for _, m := range types {
			s.Types = append(s.Types, m.ProtoReflect().Descriptor().FullName())
		}
		if _, err := system.Root.RequestFuture(bus, s, 5*time.Second).Result(); err != nil {
			t.Fatal(err)
		}
	}
	subscribe(allPID)
	subscribe(killsPID, &messages.KillRequest{})

	system.EventStream.Publish(&messages.TreeRequest{})
	system.EventStream.Publish(&messages.KillRequest{Actor: "x"})
	system.EventStream.Publish("not a protobuf event") // dropped: no converter

	want := func(c *collector, names ...string) {
		t.Helper()
		for _, n := range names {
			select {
			case m := <-c.got:
				if got := string(m.ProtoReflect().Descriptor().Name()); got != n {
					t.Fatalf("got %s, want %s", got, n)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("no %s delivered", n)
			}
		}
	}
	want(all, "TreeRequest", "KillRequest")
	want(kills, "KillRequest")

	// A subscriber that stops is dropped; the others keep receiving.
	if err := system.Root.StopFuture(allPID).Wait(); err != nil {
		t.Fatal(err)
	}
	system.EventStream.Publish(&messages.KillRequest{Actor: "y"})
	want(kills, "KillRequest")
	select {
	case m := <-all.got:
		t.Fatalf("stopped subscriber received %v", m)
	default:
	}
}
