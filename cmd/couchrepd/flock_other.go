//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package main

import (
	"errors"
	"os"
)

// errLocked: another open file description holds the lock.
var errLocked = errors.New("locked")

// flock is not available here: a data directory is not locked.
func flock(*os.File) error { return nil }
