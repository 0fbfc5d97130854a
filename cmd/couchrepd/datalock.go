package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// LockFile is the file in the data directory that couchrepd holds an
// exclusive lock on (flock) for its whole life; it holds the pid of the
// process that has it.
const LockFile = "couchrepd.lock"

// errDataDirInUse is lockDataDir's answer when another process holds the
// data directory (wrapped in a *dataDirInUseError).
var errDataDirInUse = errors.New("data directory in use")

type dataDirInUseError struct {
	dir, lockFile string
	pid           int // 0: not recorded yet
}

func (e *dataDirInUseError) Error() string {
	holder := "another process"
	if e.pid > 0 {
		holder = "another couchrepd, pid " + strconv.Itoa(e.pid)
	}
	return fmt.Sprintf("data directory %s is in use by %s (it holds the lock on %s): stop it first, or give this node a data directory of its own (--data, [couchrep] data_dir)", e.dir, holder, e.lockFile)
}

func (e *dataDirInUseError) Unwrap() error { return errDataDirInUse }

// dataDirLock is a held lock on a data directory.
type dataDirLock struct{ f *os.File }

// lockDataDir takes the exclusive lock on dir's lock file (creating dir
// and the file if needed) and writes this process's pid into it. It fails
// at once with an error wrapping errDataDirInUse, naming the holder's pid,
// when another process holds it. The kernel drops the lock when the
// process ends, however it ends.
func lockDataDir(dir string) (*dataDirLock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("data directory lock: %w", err)
	}
	if err := flock(f); err != nil {
		pid := readPID(f)
		_ = f.Close()
		if errors.Is(err, errLocked) {
			abs, aerr := filepath.Abs(dir)
			if aerr != nil {
				abs = dir
			}
			return nil, &dataDirInUseError{dir: abs, lockFile: path, pid: pid}
		}
		return nil, fmt.Errorf("data directory lock %s: %w", path, err)
	}
	if err := writePID(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("data directory lock %s: %w", path, err)
	}
	return &dataDirLock{f: f}, nil
}

func writePID(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		return err
	}
	return f.Sync()
}

// readPID reads the holder's pid from the lock file (0 if it has not
// written it yet).
func readPID(f *os.File) int {
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 32))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return pid
}

// release empties the lock file and drops the lock.
func (l *dataDirLock) release() {
	if l == nil || l.f == nil {
		return
	}
	_ = l.f.Truncate(0)
	_ = l.f.Close()
	l.f = nil
}
