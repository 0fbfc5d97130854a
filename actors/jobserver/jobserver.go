// Package jobserver is the job_server: a supervisor whose acceptor takes
// replication jobs from the shared queue (up to max_jobs on this node) and
// starts one replication job actor per job under jobs_sup
// (simple_one_for_one, temporary children).
package jobserver

import (
	"time"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/placeholder"
	"github.com/couchrep/couchrep/supervisor"
)

// Name is the job server's name under the node's root supervisor; JobsSup
// and Acceptor are its children.
const (
	Name     = "job_server"
	JobsSup  = "jobs_sup"
	Acceptor = "acceptor"
)

// Spec returns the job server's child spec in the node's supervision tree.
func Spec(deps actors.Deps) supervisor.ChildSpec {
	return supervisor.ChildSpec{
		Name: Name,
		Supervisor: &supervisor.Spec{
			Strategy:    supervisor.RestForOne,
			MaxRestarts: 10,
			Period:      time.Second,
			Children: []supervisor.ChildSpec{
				{
					Name: JobsSup,
					Supervisor: &supervisor.Spec{
						Strategy:    supervisor.SimpleOneForOne,
						MaxRestarts: 100,
						Period:      time.Second,
						Children:    []supervisor.ChildSpec{{Name: "replication_job", Restart: supervisor.Temporary}},
					},
				},
				{Name: Acceptor, Props: placeholder.Props(Acceptor, deps.Logger)},
			},
		},
	}
}
