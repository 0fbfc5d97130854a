package schedpolicy

import (
	"errors"
	"fmt"
	"time"

	"github.com/couchrep/couchrep/internal/share"
)

// Errors returned by Node.
var (
	ErrNotRunning     = errors.New("scheduler: job not running on this node")
	ErrAlreadyRunning = errors.New("scheduler: job already running on this node")
)

// Job identifies a job to the scheduler.
type Job struct {
	ID string
	// Key is the job's share key (share.Key).
	Key string
	// Continuous jobs may be rotated out; one-shot jobs never are.
	Continuous bool
}

// Placement is where a job goes in the queue: jobs.Add or jobs.Resubmit
// with this priority and scheduled time.
type Placement struct {
	Priority    uint64
	ScheduledAt time.Time
}

type runningJob struct {
	job     Job
	started time.Time
	// accounted is the running time already paid to the ledger, starting
	// with the quantum reserved at enqueue.
	accounted time.Duration
}

// Node is one node's scheduling state: the jobs running here and the
// fair-share ledger. It holds no goroutines and is not safe for concurrent
// use; the scheduler actor owns it. Job histories live in the jobs' data:
// Node takes a history and returns the updated one for the caller to store.
type Node struct {
	policy  Policy
	ledger  *share.Ledger
	clock   Clock
	running map[string]*runningJob
}

// NewNode returns a node with no running jobs.
func NewNode(p Policy, l *share.Ledger, c Clock) (*Node, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &Node{policy: p, ledger: l, clock: c, running: make(map[string]*runningJob)}, nil
}

// Policy returns the node's policy.
func (n *Node) Policy() Policy { return n.policy }

// SetPolicy changes the policy at run time (max_jobs, max_churn, ... from a
// config change); it applies from the next decision.
func (n *Node) SetPolicy(p Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	n.policy = p
	return nil
}

// Ledger returns the node's fair-share ledger.
func (n *Node) Ledger() *share.Ledger { return n.ledger }

// Add is a new job: where to put it in the queue and its first history.
func (n *Node) Add(job Job) (Placement, History) {
	now := n.clock.Now()
	return Placement{Priority: n.ledger.Enqueue(job.Key, now), ScheduledAt: now}, NewHistory(now)
}

// Slots is how many more jobs this node's acceptors may take now.
func (n *Node) Slots() int { return max(0, n.policy.MaxJobs-len(n.running)) }

// NumRunning is the number of jobs running on this node.
func (n *Node) NumRunning() int { return len(n.running) }

// Started records that this node accepted job from the queue with the given
// priority and started it; it returns the history with "started" appended.
func (n *Node) Started(job Job, priority uint64, h History) (History, error) {
	if _, ok := n.running[job.ID]; ok {
		return h, fmt.Errorf("%w: %s", ErrAlreadyRunning, job.ID)
	}
	now := n.clock.Now()
	n.ledger.Accepted(priority)
	n.running[job.ID] = &runningJob{job: job, started: now, accounted: n.ledger.Quantum()}
	return h.Append(Event{Type: EventStarted, At: now}, n.policy.MaxHistory), nil
}

// settle charges r's key for its running time not yet accounted; at the end
// of a run shorter than the reserved quantum that is a refund.
func (n *Node) settle(r *runningJob, now time.Time, final bool) {
	ran := now.Sub(r.started)
	if d := ran - r.accounted; d > 0 || final {
		n.ledger.Charge(r.job.Key, d, now)
		r.accounted = ran
	}
}

// Tick is the periodic reschedule: it charges every running job's time to
// its key and decides, given the number of due pending jobs in the queue,
// which jobs to stop (the caller stops them and calls Stopped) and how many
// the acceptors may take. It is O(running · log running).
func (n *Node) Tick(pending int) Decision {
	return Rotate(n.Running(), pending, n.policy, n.clock.Now())
}

// Running charges the running jobs' time so far to their keys and returns
// them, for Rotate or for display.
func (n *Node) Running() []RunningJob {
	now := n.clock.Now()
	out := make([]RunningJob, 0, len(n.running))
	for _, r := range n.running {
		n.settle(r, now, false)
	}
	for _, r := range n.running {
		out = append(out, RunningJob{
			ID:         r.job.ID,
			Continuous: r.job.Continuous,
			Started:    r.started,
		})
	}
	return out
}

func (n *Node) finish(id string) (*runningJob, time.Time, error) {
	r, ok := n.running[id]
	if !ok {
		return nil, time.Time{}, fmt.Errorf("%w: %s", ErrNotRunning, id)
	}
	now := n.clock.Now()
	n.settle(r, now, true)
	delete(n.running, id)
	return r, now, nil
}

// Stopped records that the scheduler stopped job id cleanly (rotation,
// excess, shutdown): it returns where to resubmit it (its new fair-share
// deadline, due now) and its history with "stopped" appended.
func (n *Node) Stopped(id string, h History) (Placement, History, error) {
	r, now, err := n.finish(id)
	if err != nil {
		return Placement{}, h, err
	}
	h = h.Append(Event{Type: EventStopped, At: now}, n.policy.MaxHistory)
	return Placement{Priority: n.ledger.Enqueue(r.job.Key, now), ScheduledAt: now}, h, nil
}

// Crashed records that job id crashed: it returns its history with the
// crash appended and where to resubmit it, due after the backoff of its
// consecutive crashes (History.BackoffUntil). Whether a crashed transient
// job is retried at all is the caller's decision.
func (n *Node) Crashed(id, reason string, h History) (Placement, History, error) {
	r, now, err := n.finish(id)
	if err != nil {
		return Placement{}, h, err
	}
	h = h.Append(Event{Type: EventCrashed, At: now, Reason: reason}, n.policy.MaxHistory)
	return Placement{Priority: n.ledger.Enqueue(r.job.Key, now), ScheduledAt: h.BackoffUntil(n.policy)}, h, nil
}

// Completed records that job id finished (a one-shot job reached the end of
// its changes feed, or the job failed permanently): its time is charged and
// it leaves the node.
func (n *Node) Completed(id string) error {
	_, _, err := n.finish(id)
	return err
}
