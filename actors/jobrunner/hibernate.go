package jobrunner

import (
	"context"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/park"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/messages"
)

// Hibernation: a parked job whose node keeps it (Options.Hibernate, the
// job server's registry) leaves the actor system. Its actor hands over
// what the job's wake-up needs — the run (its worker lock under the node's
// lease; the record is dropped and read back when needed), its wake-up
// source and the wait before its next recheck — and exits without touching
// the run: the job stays running in the store, parked. A wake-up (the
// source's signal, the recheck timer) respawns an actor with Options.Resume:
// it reads the record back, looks at the source once
// (replicate.OpenParked: `_changes?since=<checkpoint>&limit=1`, or the
// update_seq first for a recheck) and either hibernates again or runs from
// the checkpoint. A job accepted with a record that says parked (a node
// adopting another's jobs, or restarting) goes straight to sleep: its
// record is marked started (repjob.Run.StartParked), its wake-up source
// opened, and its first recheck drawn early (park.AdoptJitter), with no
// request to its source.

// Hibernated is a parked job without an actor (Options.Hibernate).
type Hibernated struct {
	// Run is the job's run, its record dropped (repjob.Run.Hibernate).
	Run *repjob.Run
	// Wake is the job's open wake-up source; whoever ends the job closes it.
	Wake park.Wake
	// Recheck is the wait before the job's next recheck (zero: the one
	// armed before it was woken, if any, else a jittered Period).
	Recheck time.Duration
	// Period is the job's park_recheck.
	Period time.Duration
	// Unchecked: Wake was opened after the job's checkpoint (a node
	// adopting it), so it cannot tell the changes in between: the next look
	// reads the source, even where Wake could answer itself (a shared
	// feed's watch).
	Unchecked bool
	// Seq is the seq the job is parked at (its checkpoint, compacted:
	// replicate.CompactSeq), nil when unknown: a recheck that reads the
	// source's update_seq without an actor (the job server's batched
	// looks) compares it with replicate.SeqPast.
	Seq couch.Seq
}

// Resume is the wake-up a job actor is respawned for (Options.Resume).
type Resume struct {
	// Wake is the job's wake-up source, handed back to the actor.
	Wake park.Wake
	// Recheck: the recheck timer woke it (it compares update_seq first),
	// not a signal of its source.
	Recheck bool
	// Unchecked is the hibernated job's (Hibernated.Unchecked).
	Unchecked bool
}

// stopParkedReasons are the stops after which a parked job stays parked in
// its record: another node (or this one, restarted) takes it from the queue
// and puts it straight to sleep. An operator's stop or restart, a rotation
// and a cancel end the parked state as they end a run.
var stopParkedReasons = map[string]bool{"drain": true, "shutdown": true, "superseded": true}

// Stop reasons of an operator's pause and reset (repjob.Run.Pause,
// Run.Reset): the job actor ends its run with them.
const (
	StopPaused = "paused"
	StopReset  = "reset"
)

// stopFor is how a run stopped for reason goes back to the queue: paused,
// reset, parked (a parked job stopped by a drain or a shutdown, parked
// says it is) or plainly stopped.
func stopFor(run *repjob.Run, reason string, parked bool) func(context.Context) error {
	switch {
	case reason == StopPaused:
		return run.Pause
	case reason == StopReset:
		return run.Reset
	case parked && stopParkedReasons[reason]:
		return run.StopParked
	}
	return run.Stop
}

// End ends a hibernated job as a stop ends a running one (a stop request,
// a rotation, a drain, a shutdown; reason says which): its wake-up source
// closed, the job back in the queue (repjob.Run.Stop; StopParked for a
// drain or a shutdown), a pending event published on system's event stream
// (nil: none). A job lost meanwhile (canceled, removed, taken by another
// node) is not an error: nothing is written.
func (h *Hibernated) End(ctx context.Context, system *actor.ActorSystem, node, reason string) error {
	if h.Wake != nil {
		h.Wake.Close()
	}
	run := h.Run
	stop := stopFor(run, reason, true)
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err := stop(c)
	if repjob.IsLost(err) {
		return nil
	}
	if err != nil {
		run.Abandon()
		return err
	}
	if system != nil {
		rec := run.Record()
		publishEvent(system, node, rec, repjob.StatePending, reason, rec.Stats)
	}
	return nil
}

// take hands the parker's wake-up source over (to a Hibernated): the
// parker no longer closes it.
func (pk *parker) take() park.Wake {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	w := pk.wake
	pk.wake = nil
	return w
}

// give takes a wake-up source back (a hibernation was refused).
func (pk *parker) give(w park.Wake) {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.wake == nil {
		pk.wake = w
	} else if w != nil {
		w.Close()
	}
}

// hibernate hands the parked job to Options.Hibernate: true means the
// registry has it and the actor must exit without touching the run; false
// (no registry, or a stop on its way) that the actor keeps it. A job handed
// over publishes a progress event without stats on system's event stream
// (nil: none): the node's live view of its stats (httpapi's) drops them,
// the record has them (the park's checkpoint wrote them), and a hibernated
// job keeps nothing there.
func (a *jobActor) hibernate(system *actor.ActorSystem, h *Hibernated) bool {
	a.mu.Lock()
	stopping := a.stopReason != ""
	a.mu.Unlock()
	if stopping || a.o.Hibernate == nil || h.Wake == nil {
		return false
	}
	id := h.Run.ID()
	if !a.o.Hibernate(h) {
		return false
	}
	if system != nil {
		system.EventStream.Publish(&messages.ReplicationJobEvent{JobId: id, State: repjob.StateRunning.Proto(),
			Node: a.o.Node, Timestamp: timestamppb.Now(), Progress: true})
	}
	return true
}

// adopt puts a job accepted with a parked record straight to sleep: its
// wake-up source is opened, nothing is sent to its source. handled false:
// the job cannot park here (no wake-up source, parking off), and runs.
func (a *jobActor) adopt(ctx context.Context, system *actor.ActorSystem, p replicate.Params) (handled bool, err error) {
	a.parkedNow.Store(true)
	o := a.engineOptions(p)
	pk := a.parking(ctx, &p, &o, nil)
	if pk == nil {
		a.parkedNow.Store(false)
		return false, nil
	}
	w := pk.take()
	if w == nil {
		pk.close()
		a.parkedNow.Store(false)
		a.log.Debug().Msg("replication job: accepted parked, but cannot park now; running")
		return false, nil
	}
	h := &Hibernated{Run: a.run, Wake: w, Recheck: park.AdoptJitter(p.ParkRecheck), Period: p.ParkRecheck, Unchecked: true,
		Seq: replicate.CompactSeq(couch.Seq(a.run.Record().GetStats().GetCheckpointedSourceSeq()))}
	if a.hibernate(system, h) {
		a.log.Debug().Dur("first_recheck", h.Recheck).Msg("replication job: adopted parked; asleep without a look")
		return true, nil
	}
	// A stop is on its way: it ends the job as a stop.
	w.Close()
	pk.close()
	<-ctx.Done()
	return true, a.handBack(system, true)
}

// wakeUp is the work of an actor respawned for a hibernated job's wake-up
// (Options.Resume): read the record back, look at the source once, then
// hibernate again or run from the checkpoint.
func (a *jobActor) wakeUp(ctx context.Context, system *actor.ActorSystem, self *actor.PID, rs *Resume) error {
	run := a.run
	a.parkedNow.Store(true)
	if err := run.Load(ctx); err != nil {
		rs.Wake.Close()
		if ctx.Err() != nil {
			return a.handBack(system, true)
		}
		return err
	}
	rec := run.Record()
	p, err := a.params(rec.Body)
	if err != nil {
		rs.Wake.Close()
		return a.fail(system, err.Error())
	}
	o := a.engineOptions(p)
	pk := a.parking(ctx, &p, &o, rs.Wake)
	if pk == nil {
		rs.Wake.Close()
		return a.resumeRun(ctx, system, self, p, nil)
	}
	moved := true
	if pk.ensure(ctx) {
		if err := a.acquireLease(ctx, system, self, p); err != nil {
			pk.close()
			if ctx.Err() != nil {
				return a.handBack(system, true)
			}
			return a.crash(system, "connection_pool: "+err.Error())
		}
		o = a.engineOptions(p)
		seq := couch.Seq(rec.GetStats().GetCheckpointedSourceSeq())
		if len(seq) > 0 {
			since := time.Now()
			if ps := rec.GetParkedSince(); ps != nil {
				since = ps.AsTime()
			}
			parked, err := replicate.OpenParked(p, o, seq, since)
			if err == nil {
				moved = pk.moved(ctx, parked, rs.Recheck, rs.Unchecked)
			}
		}
	}
	if ctx.Err() != nil {
		pk.close()
		return a.handBack(system, true)
	}
	if !moved {
		if a.lease != nil {
			a.lease.CloseIdle()
		}
		var next time.Duration
		if rs.Recheck {
			next = park.Jitter(p.ParkRecheck)
		}
		// The look read the source (or the watch vouched for it): checked,
		// unless it could not look (no seq recorded).
		h := &Hibernated{Run: run, Wake: pk.take(), Recheck: next, Period: p.ParkRecheck,
			Seq: replicate.CompactSeq(couch.Seq(rec.GetStats().GetCheckpointedSourceSeq()))}
		if a.hibernate(system, h) {
			a.log.Debug().Bool("recheck", rs.Recheck).Msg("replication job: looked while parked; nothing moved, asleep again")
			return nil
		}
		pk.give(h.Wake)
		<-ctx.Done() // a stop is on its way
		pk.close()
		return a.handBack(system, true)
	}
	return a.resumeRun(ctx, system, self, p, pk)
}

// resumeRun starts a run of a woken job from its checkpoint (its
// replication id was claimed when the job started on this node).
func (a *jobActor) resumeRun(ctx context.Context, system *actor.ActorSystem, self *actor.PID, p replicate.Params, pk *parker) error {
	if a.lease == nil {
		if err := a.acquireLease(ctx, system, self, p); err != nil {
			pk.close()
			if ctx.Err() != nil {
				return a.handBack(system, true)
			}
			return a.crash(system, "connection_pool: "+err.Error())
		}
	}
	a.parkedNow.Store(false)
	c, cancel := context.WithTimeout(ctx, progressWriteTimeout)
	if err := a.run.Park(c, time.Time{}, replicate.Stats{}); err != nil && !repjob.IsLost(err) && ctx.Err() == nil {
		a.log.Warn().Err(err).Msg("replication job: recording it resumed failed")
	}
	cancel()
	a.log.Debug().Msg("replication job: resuming")
	return a.replicate(ctx, system, self, p, pk)
}
