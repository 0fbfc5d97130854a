package supervisor_test

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/couchrep/couchrep/supervisor"
)

var (
	randomSeed  = flag.Uint64("supervisor.seed", 0, "seed of TestRandomKills (0: from the clock)")
	randomKills = flag.Int("supervisor.kills", 0, "kills in TestRandomKills (0: 3000, or 300 with -short)")
)

// idle is a worker that does nothing.
type idle struct{}

func (idle) Receive(actor.Context) {}

var idleProps = actor.PropsFromProducer(func() actor.Actor { return idle{} })

func idleChild(name string, r supervisor.Restart) supervisor.ChildSpec {
	return supervisor.ChildSpec{Name: name, Props: idleProps, Restart: r}
}

// TestRandomKills kills random actors of a three-level tree of mixed
// strategies thousands of times. After each kill it waits for the heal
// through events, and checks from the event log and the tree that exactly
// the children the parent's strategy names were restarted, in start order,
// that nothing else changed incarnation, and that the tree is whole again.
func TestRandomKills(t *testing.T) {
	seed := *randomSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	kills := *randomKills
	if kills == 0 {
		kills = 3000
		if testing.Short() {
			kills = 300
		}
	}
	t.Logf("seed %d (rerun with -supervisor.seed=%d), %d kills", seed, seed, kills)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))

	const many, forever = 1 << 30, time.Hour // intensity never reached
	sup := func(s supervisor.Strategy, children ...supervisor.ChildSpec) *supervisor.Spec {
		return &supervisor.Spec{Strategy: s, MaxRestarts: many, Period: forever, Children: children}
	}
	spec := *sup(supervisor.OneForOne,
		idleChild("w1", supervisor.Permanent),
		supervisor.ChildSpec{Name: "s1", Supervisor: sup(supervisor.RestForOne,
			idleChild("w1", supervisor.Permanent),
			supervisor.ChildSpec{Name: "s2", Supervisor: sup(supervisor.OneForAll,
				idleChild("w1", supervisor.Permanent),
				idleChild("w2", supervisor.Transient),
				idleChild("w3", supervisor.Permanent),
			)},
			idleChild("w2", supervisor.Transient),
		)},
		supervisor.ChildSpec{Name: "s3", Restart: supervisor.Transient, Supervisor: sup(supervisor.OneForAll,
			idleChild("w1", supervisor.Transient),
			supervisor.ChildSpec{Name: "s4", Supervisor: sup(supervisor.OneForOne,
				idleChild("w1", supervisor.Permanent),
				idleChild("w2", supervisor.Permanent),
			)},
			idleChild("w2", supervisor.Permanent),
		)},
		supervisor.ChildSpec{Name: "s5", Supervisor: sup(supervisor.SimpleOneForOne, idleChild("job", supervisor.Permanent))},
		idleChild("w2", supervisor.Permanent),
	)
	system := newSystem(t)
	events := watchEvents(t, system)
	top := startTree(t, system, "top", spec)
	s5 := actor.NewPID("nonhost", "top/s5")
	startJobs := func() {
		for _, n := range []string{"d1", "d2", "d3"} {
			if _, err := supervisor.StartChild(testContext(t), system, s5, n, nil); err != nil {
				t.Fatalf("StartChild(%s): %v", n, err)
			}
		}
	}
	startJobs()

	tree := which(t, system, top.PID())
	wantNodes := len(flatten(tree))
	for k := 0; k < kills; k++ {
		before := flatten(tree)
		var targets []string
		for path := range before {
			if path != "top" {
				targets = append(targets, path)
			}
		}
		slices.Sort(targets)
		target := targets[rng.IntN(len(targets))]
		node := before[target]
		parentPath := target[:strings.LastIndex(target, "/")]
		parent := before[parentPath]
		expect := expectedRestarts(parent, node.Name)

		from := events.mark()
		reason := fmt.Sprintf("chaos-%d", k)
		if err := supervisor.Kill(testContext(t), system, node.PID, reason); err != nil {
			t.Fatalf("kill %d (%s): %v", k, target, err)
		}
		_, exited := events.await(t, from, target+" exited", is(supervisor.ChildExited, parentPath, node.Name))
		if exited.Reason != "killed: "+reason {
			t.Fatalf("kill %d (%s): exit reason %q", k, target, exited.Reason)
		}
		pos := from
		for _, name := range expect {
			pos, _ = events.await(t, pos, parentPath+"/"+name+" restarted", is(supervisor.ChildRestarted, parentPath, name))
			pos++
		}
		var restarted []string
		for _, e := range events.since(from) {
			if e.Kind == supervisor.ChildRestarted {
				restarted = append(restarted, e.Supervisor+"/"+e.Child)
			}
		}
		var want []string
		for _, name := range expect {
			want = append(want, parentPath+"/"+name)
		}
		if !equal(restarted, want) {
			t.Fatalf("kill %d (%s under %s, %s): restarted %v, want %v\nevents:\n%s",
				k, target, parentPath, parent.Strategy, restarted, want, formatEvents(events.since(from)))
		}
		if target == "top/s5" {
			startJobs() // a restarted simple_one_for_one supervisor starts empty
		}

		tree = which(t, system, top.PID())
		after := flatten(tree)
		if len(after) != wantNodes {
			t.Fatalf("kill %d (%s): tree has %d nodes, want %d:\n%s", k, target, len(after), wantNodes, tree)
		}
		for path, n := range after {
			if n.State != supervisor.Running {
				t.Fatalf("kill %d (%s): %s is %s:\n%s", k, target, path, n.State, tree)
			}
			old, existed := before[path]
			switch {
			case !existed:
				t.Fatalf("kill %d (%s): new node %s", k, target, path)
			case isRestartedOrBelow(path, parentPath, expect):
				if under(path, parentPath, expect) && n.Incarnation != 1 {
					t.Fatalf("kill %d (%s): %s below a restarted supervisor has incarnation %d", k, target, path, n.Incarnation)
				}
				if !under(path, parentPath, expect) && n.Incarnation != old.Incarnation+1 {
					t.Fatalf("kill %d (%s): restarted %s incarnation %d → %d", k, target, path, old.Incarnation, n.Incarnation)
				}
			case n.Incarnation != old.Incarnation:
				t.Fatalf("kill %d (%s): %s changed incarnation %d → %d though its strategy spared it", k, target, path, old.Incarnation, n.Incarnation)
			}
		}
	}
	if err := top.Err(); err != nil {
		t.Fatalf("top supervisor: %v", err)
	}
	t.Logf("final tree after %d kills:\n%s", kills, tree)
}

// flatten maps each node's path ("top/s1/w1") to the node.
func flatten(tree *supervisor.TreeNode) map[string]*supervisor.TreeNode {
	m := map[string]*supervisor.TreeNode{}
	tree.Walk(func(path string, n *supervisor.TreeNode) { m[path] = n })
	return m
}

// expectedRestarts: the children of parent its strategy restarts, in start
// order, when child killed exits abnormally.
func expectedRestarts(parent *supervisor.TreeNode, killed string) []string {
	var names []string
	switch parent.Strategy {
	case supervisor.OneForAll:
		for _, c := range parent.Children {
			if c.Restart != supervisor.Temporary {
				names = append(names, c.Name)
			}
		}
	case supervisor.RestForOne:
		seen := false
		for _, c := range parent.Children {
			seen = seen || c.Name == killed
			if seen && c.Restart != supervisor.Temporary {
				names = append(names, c.Name)
			}
		}
	default:
		names = []string{killed}
	}
	return names
}

// isRestartedOrBelow: path is one of the restarted children of parentPath or
// lies below one of them.
func isRestartedOrBelow(path, parentPath string, restarted []string) bool {
	for _, name := range restarted {
		p := parentPath + "/" + name
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

// under: path lies strictly below one of the restarted children.
func under(path, parentPath string, restarted []string) bool {
	for _, name := range restarted {
		if strings.HasPrefix(path, parentPath+"/"+name+"/") {
			return true
		}
	}
	return false
}
