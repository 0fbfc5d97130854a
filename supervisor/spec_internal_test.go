package supervisor

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

func TestNormalized(t *testing.T) {
	props := actor.PropsFromFunc(func(actor.Context) {})
	cases := []struct {
		name         string
		spec         Spec
		max          int
		period       time.Duration
		restart      Restart
		shutdown     time.Duration
		nestedShtdwn time.Duration
	}{
		{"zero period selects OTP defaults", Spec{MaxRestarts: 7}, 1, 5 * time.Second, Permanent, 5 * time.Second, Infinity},
		{"explicit intensity kept", Spec{MaxRestarts: 7, Period: time.Second}, 7, time.Second, Permanent, 5 * time.Second, Infinity},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.Children = []ChildSpec{{Name: "w", Props: props}, {Name: "s", Supervisor: &Spec{Strategy: OneForOne}}}
			n := tc.spec.normalized()
			if n.MaxRestarts != tc.max || n.Period != tc.period {
				t.Errorf("intensity %d/%s, want %d/%s", n.MaxRestarts, n.Period, tc.max, tc.period)
			}
			if w := n.Children[0]; w.Restart != tc.restart || w.Shutdown != tc.shutdown {
				t.Errorf("worker %s %s", w.Restart, w.Shutdown)
			}
			if s := n.Children[1]; s.Shutdown != tc.nestedShtdwn {
				t.Errorf("nested supervisor shutdown %s", s.Shutdown)
			}
		})
	}
}

func TestStrings(t *testing.T) {
	cases := []struct{ got, want string }{
		{OneForOne.String(), "one_for_one"},
		{OneForAll.String(), "one_for_all"},
		{RestForOne.String(), "rest_for_one"},
		{SimpleOneForOne.String(), "simple_one_for_one"},
		{Restart(0).String(), "permanent"},
		{Transient.String(), "transient"},
		{Temporary.String(), "temporary"},
		{Starting.String(), "starting"},
		{Stopped.String(), "stopped"},
		{ChildRestarted.String(), "child_restarted"},
		{Escalated.String(), "escalated"},
		{EventKind(99).String(), "event(99)"},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
