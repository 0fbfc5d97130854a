package config

import (
	"fmt"
	"syscall"
)

// fdBase is what a node holds besides its jobs' connections: the job
// store, listeners, the admin endpoint, logs, the connection pool's idle
// connections to a few servers.
const fdBase = 256

// FileDescriptors is the file-descriptor budget of a node: fdBase plus two
// per job it may run (max_jobs): a running continuous job holds one
// connection for its _changes feed, and one more while it fetches or
// writes (requests of active jobs beyond that wait for a connection slot of
// the connection pool rather than open more, see http_connections).
func (c Config) FileDescriptors() int {
	if !c.HasNodeType(NodeTypeReplication) {
		return fdBase
	}
	return fdBase + 2*c.Replicator.MaxJobs
}

// FDWarning returns a warning when the process may open fewer files
// (RLIMIT_NOFILE, which the Go runtime raises to the hard limit at start)
// than the node's budget, "" otherwise.
func FDWarning(c Config) string {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return ""
	}
	return fdWarning(c.FileDescriptors(), lim.Cur, c.Replicator.MaxJobs)
}

func fdWarning(need int, limit uint64, maxJobs int) string {
	if uint64(need) <= limit {
		return ""
	}
	return fmt.Sprintf("open file limit (ulimit -n) %d is below the %d this node may need for max_jobs = %d "+
		"(%d + 2 per job): raise it, or lower max_jobs to %d", limit, need, maxJobs, fdBase, max(0, (int(limit)-fdBase)/2))
}
