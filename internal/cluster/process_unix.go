//go:build unix

package cluster

import (
	"errors"
	"syscall"
)

// processGone reports whether no process with pid runs on this host.
func processGone(pid int64) bool {
	if pid <= 0 || int64(int(pid)) != pid {
		return false
	}
	err := syscall.Kill(int(pid), 0)
	return errors.Is(err, syscall.ESRCH)
}
