package jobserver

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/internal/admin"
	"github.com/couchrep/couchrep/internal/cluster"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/messages"
)

// server answers the job server's admin requests. Its methods run on
// goroutines of their own, never in Receive.
type server struct {
	store   *repjob.Store
	cluster *cluster.Registry
	reg     *Registry
	node    string
	log     zerolog.Logger
}

// handle answers a job request.
func (s *server) handle(ctx context.Context, msg proto.Message) (proto.Message, error) {
	if s.store == nil {
		return nil, fmt.Errorf("%w: this node has no job store", actors.ErrUnknownRequest)
	}
	switch m := msg.(type) {
	case *messages.ListJobsRequest:
		return s.list(ctx, m)
	case *messages.GetJobRequest:
		rec, err := s.find(ctx, m.GetId())
		if err != nil {
			return nil, err
		}
		return &messages.GetJobResponse{Job: admin.JobSummary(rec, true)}, nil
	case *messages.StopJobRequest:
		rec, err := s.control(ctx, m.GetId(), messages.JobControl_ACTION_STOP)
		if err != nil {
			return nil, err
		}
		return &messages.StopJobResponse{Job: admin.JobSummary(rec, true)}, nil
	case *messages.RestartJobRequest:
		rec, err := s.restart(ctx, m.GetId())
		if err != nil {
			return nil, err
		}
		return &messages.RestartJobResponse{Job: admin.JobSummary(rec, true)}, nil
	case *messages.CancelJobRequest:
		return s.cancel(ctx, m.GetId())
	case *messages.PauseJobRequest:
		rec, err := s.operate(ctx, m.GetId(), "pause", s.store.Pause, (*repjob.Record).Paused)
		if err != nil {
			return nil, err
		}
		return &messages.PauseJobResponse{Job: admin.JobSummary(rec, true)}, nil
	case *messages.ResumeJobRequest:
		rec, err := s.resume(ctx, m.GetId())
		if err != nil {
			return nil, err
		}
		return &messages.ResumeJobResponse{Job: admin.JobSummary(rec, true)}, nil
	case *messages.ResetJobRequest:
		rec, err := s.operate(ctx, m.GetId(), "reset", s.store.Reset, func(r *repjob.Record) bool { return r.GetResetAt() != nil })
		if err != nil {
			return nil, err
		}
		return &messages.ResetJobResponse{Job: admin.JobSummary(rec, true)}, nil
	case *messages.ReplicateRequest:
		return s.replicate(ctx, m)
	default:
		return nil, fmt.Errorf("%w: %T", actors.ErrUnknownRequest, msg)
	}
}

func (s *server) list(ctx context.Context, req *messages.ListJobsRequest) (*messages.ListJobsResponse, error) {
	resp := &messages.ListJobsResponse{}
	if len(req.GetStates()) == 0 && req.GetDatabase() == "" && req.GetNode() == "" {
		// No filter: the store reads only the page.
		limit := -1
		if req.GetLimit() > 0 {
			limit = int(req.GetLimit())
		}
		p, err := s.store.Jobs(ctx, 0, limit)
		if err != nil {
			return nil, fmt.Errorf("couchrep: list jobs: %w", err)
		}
		resp.Total = uint32(p.Total)
		for _, r := range p.Jobs {
			resp.Jobs = append(resp.Jobs, admin.JobSummary(r, false))
		}
		return resp, nil
	}
	err := s.store.Each(ctx, admin.JobFilter(req), func(r *repjob.Record) error {
		resp.Total++
		if req.GetLimit() == 0 || uint32(len(resp.Jobs)) < req.GetLimit() {
			resp.Jobs = append(resp.Jobs, admin.JobSummary(r, false))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("couchrep: list jobs: %w", err)
	}
	return resp, nil
}

// find finds the job id names (admin.FindJob: job id, replication id,
// actor name or a unique prefix, credentials matched after redaction).
func (s *server) find(ctx context.Context, id string) (*repjob.Record, error) {
	rec, err := admin.FindJob(ctx, s.store, id)
	switch {
	case errors.Is(err, admin.ErrNoSuchJob):
		return nil, fmt.Errorf("%w: %w", actors.ErrJobNotFound, err)
	case errors.Is(err, admin.ErrAmbiguousJob):
		return nil, fmt.Errorf("%w: %w", actors.ErrInvalidRequest, err)
	case err != nil:
		return nil, fmt.Errorf("couchrep: %w", err)
	}
	return rec, nil
}

// control stops (or restarts) a running job cleanly, on whichever node runs
// it: the request goes through the store to that node's job server, and
// control returns the job once it was carried out.
func (s *server) control(ctx context.Context, id string, action messages.JobControl_Action) (*repjob.Record, error) {
	rec, err := s.find(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec.State() != repjob.StateRunning {
		return nil, fmt.Errorf("%w: job %s is %s", actors.ErrJobNotRunning, rec.GetJobId(), rec.State())
	}
	if err := s.alive(ctx, rec.WorkerNode); err != nil {
		return nil, fmt.Errorf("job %s: %w", rec.GetJobId(), err)
	}
	c, err := s.store.RequestControl(ctx, rec.GetJobId(), action, s.node)
	switch {
	case errors.Is(err, repjob.ErrNotRunning):
		return nil, fmt.Errorf("%w: job %s stopped meanwhile", actors.ErrJobNotRunning, rec.GetJobId())
	case errors.Is(err, repjob.ErrNotFound):
		return nil, fmt.Errorf("%w: %q", actors.ErrJobNotFound, rec.GetJobId())
	case err != nil:
		return nil, fmt.Errorf("couchrep: %s job %s: %w", actionName(action), rec.GetJobId(), err)
	}
	if err := s.store.WaitControl(ctx, c); err != nil {
		return nil, fmt.Errorf("%w: node %q has not carried out the %s of job %s yet: %w",
			actors.ErrJobElsewhere, c.GetNode(), actionName(action), rec.GetJobId(), err)
	}
	s.log.Info().Str("job_id", rec.GetJobId()).Str("node", c.GetNode()).Msg("job " + actionName(action) + " by an admin request")
	return s.find(ctx, rec.GetJobId())
}

func actionName(a messages.JobControl_Action) string {
	switch a {
	case messages.JobControl_ACTION_RESTART:
		return "restart"
	case messages.JobControl_ACTION_CANCEL:
		return "cancel"
	default:
		return "stop"
	}
}

// alive returns nil if node is a live member of the cluster, else an error
// wrapping actors.ErrJobElsewhere: a request to a node that is gone would
// wait for nothing (its jobs go back to the queue after the activity
// timeout).
func (s *server) alive(ctx context.Context, node string) error {
	if node == s.node || s.cluster == nil {
		return nil
	}
	members, err := s.cluster.Members(ctx)
	if err != nil {
		return err
	}
	if i := slices.IndexFunc(members, func(m cluster.Member) bool { return m.GetName() == node }); i >= 0 && members[i].Alive {
		return nil
	}
	return fmt.Errorf("%w: it runs on node %q, which is not alive: the job goes back to the queue after the activity timeout",
		actors.ErrJobElsewhere, node)
}

// restart makes a job run again now: a running job is stopped cleanly (on
// whichever node runs it) and is due at once; a pending, crashing,
// completed or failed one is resubmitted due now (a crashing job's backoff
// is skipped).
func (s *server) restart(ctx context.Context, id string) (*repjob.Record, error) {
	rec, err := s.find(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec.Paused() {
		return nil, fmt.Errorf("%w: job %s is paused: `couchrepctl job resume %s` runs it again", actors.ErrInvalidRequest,
			rec.GetJobId(), rec.GetJobId())
	}
	if rec.State() == repjob.StateRunning {
		return s.control(ctx, rec.GetJobId(), messages.JobControl_ACTION_RESTART)
	}
	if err := s.store.Queue().Resubmit(ctx, repjob.JobType, rec.GetJobId(), jobqueue.ResubmitOptions{}); err != nil {
		return nil, fmt.Errorf("couchrep: restart job %s: %w", rec.GetJobId(), err)
	}
	s.log.Info().Str("job_id", rec.GetJobId()).Msg("job restarted by an admin request")
	return s.find(ctx, rec.GetJobId())
}

// cancel removes a transient job. A running one is stopped at once by the
// node running it; if that node does not carry it out, the job stops at its
// worker's next write. The job of a _replicator document is refused
// (actors.ErrJobFollowsDocument), as CouchDB refuses to cancel it: only its
// document ends it (deleted, or changed), and `job stop` ends its current
// run.
func (s *server) cancel(ctx context.Context, id string) (*messages.CancelJobResponse, error) {
	rec, err := s.find(ctx, id)
	if err != nil {
		return nil, err
	}
	id = rec.GetJobId()
	c, err := s.store.Cancel(ctx, id, s.node)
	if errors.Is(err, repjob.ErrDocumentJob) {
		return nil, fmt.Errorf("%w: job %s is the job of document %q in %s on %s: delete or change the document to end it "+
			"(as in CouchDB); `couchrepctl job stop` ends its current run", actors.ErrJobFollowsDocument,
			id, rec.GetDocId(), rec.GetDbName(), redact.URL(rec.GetServer()))
	}
	if err != nil && !errors.Is(err, repjob.ErrNotFound) {
		return nil, fmt.Errorf("couchrep: cancel job %s: %w", id, err)
	}
	if c != nil && s.alive(ctx, c.GetNode()) == nil {
		if err := s.store.WaitControl(ctx, c); err != nil {
			s.log.Warn().Err(err).Str("job_id", id).Str("node", c.GetNode()).Msg("canceled job not stopped yet; it stops at its next write")
		}
	}
	s.log.Info().Str("job_id", id).Msg("job canceled by an admin request")
	return &messages.CancelJobResponse{Id: id}, nil
}

// replicate adds a transient job, as POST /_replicate does.
func (s *server) replicate(ctx context.Context, req *messages.ReplicateRequest) (*messages.ReplicateResponse, error) {
	user := req.GetUser()
	if user == "" {
		user = "admin"
	}
	res, err := s.store.AddTransient(ctx, []byte(req.GetBody()), user)
	if err != nil {
		if errors.Is(err, repjob.ErrInvalid) {
			return nil, fmt.Errorf("%w: %w", actors.ErrInvalidRequest, err)
		}
		return nil, fmt.Errorf("couchrep: add replication: %w", err)
	}
	return &messages.ReplicateResponse{Id: res.JobID, ReplicationId: res.RepID}, nil
}

// drain records that this node is drained (it stays so across restarts),
// then stops every job running here cleanly so that other nodes take them
// from the queue. The acceptor already stopped accepting.
func (s *server) drain(ctx context.Context, system *actor.ActorSystem) (*messages.DrainResponse, error) {
	if err := s.setDraining(ctx, true); err != nil {
		return nil, err
	}
	exits := s.reg.stopAll(system, "drain")
	ids := make([]string, 0, len(exits))
	for id, done := range exits {
		select {
		case <-done:
			ids = append(ids, id)
		case <-ctx.Done():
			return nil, fmt.Errorf("couchrep: drain: job %s still stopping: %w", id, ctx.Err())
		}
	}
	slices.Sort(ids)
	s.log.Info().Int("released", len(ids)).Strs("job_ids", ids).Msg("node drained")
	return &messages.DrainResponse{Released: uint32(len(ids)), JobIds: ids}, nil
}

// undrain records that this node accepts jobs again; the acceptor already
// does.
func (s *server) undrain(ctx context.Context) (*messages.UndrainResponse, error) {
	if err := s.setDraining(ctx, false); err != nil {
		return nil, err
	}
	s.log.Info().Msg("node undrained: accepting jobs")
	return &messages.UndrainResponse{}, nil
}

func (s *server) setDraining(ctx context.Context, draining bool) error {
	if s.cluster == nil {
		return nil
	}
	if err := s.cluster.SetDraining(ctx, s.node, draining); err != nil {
		return fmt.Errorf("couchrep: record the drain state: %w", err)
	}
	return nil
}

// operate pauses or resets a job (op, done tells it happened) on whichever
// node runs it: a job that does not run is changed in the store at once; a
// running one is stopped by its node, whose run records the change as it
// ends (repjob.Run.Pause, Run.Reset). A run that ended otherwise meanwhile
// (rotation, a crash) is changed in the store on the next try.
func (s *server) operate(ctx context.Context, id, what string,
	op func(ctx context.Context, jobID, by string) (*messages.JobControl, error), done func(*repjob.Record) bool) (*repjob.Record, error) {
	rec, err := s.find(ctx, id)
	if err != nil {
		return nil, err
	}
	id = rec.GetJobId()
	for try := 0; ; try++ {
		if rec.State() == repjob.StateRunning {
			if err := s.alive(ctx, rec.WorkerNode); err != nil {
				return nil, fmt.Errorf("job %s: %w", id, err)
			}
		}
		c, err := op(ctx, id, s.node)
		switch {
		case errors.Is(err, repjob.ErrFinished):
			return nil, fmt.Errorf("%w: job %s is %s: nothing to %s", actors.ErrJobNotRunning, id, rec.State(), what)
		case errors.Is(err, repjob.ErrNotFound):
			return nil, fmt.Errorf("%w: %q", actors.ErrJobNotFound, id)
		case err != nil:
			return nil, fmt.Errorf("couchrep: %s job %s: %w", what, id, err)
		}
		if c != nil {
			if err := s.store.WaitControl(ctx, c); err != nil {
				return nil, fmt.Errorf("%w: node %q has not carried out the %s of job %s yet: %w",
					actors.ErrJobElsewhere, c.GetNode(), what, id, err)
			}
		}
		if rec, err = s.find(ctx, id); err != nil {
			return nil, err
		}
		if c == nil || done(rec) || try == 4 {
			s.log.Info().Str("job_id", id).Str("node", c.GetNode()).Msg("job " + what + " by an admin request")
			return rec, nil
		}
	}
}

// resume makes a paused job due again.
func (s *server) resume(ctx context.Context, id string) (*repjob.Record, error) {
	rec, err := s.find(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := s.store.Resume(ctx, rec.GetJobId()); err != nil {
		if errors.Is(err, repjob.ErrNotFound) {
			return nil, fmt.Errorf("%w: %q", actors.ErrJobNotFound, rec.GetJobId())
		}
		return nil, fmt.Errorf("couchrep: resume job %s: %w", rec.GetJobId(), err)
	}
	s.log.Info().Str("job_id", rec.GetJobId()).Msg("job resumed by an admin request")
	return s.find(ctx, rec.GetJobId())
}
