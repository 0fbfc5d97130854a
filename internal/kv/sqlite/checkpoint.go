package sqlite

import (
	"time"
)

// Checkpoints off the commit path.
//
// SQLite's automatic checkpoint runs inside the COMMIT that pushes the WAL
// past 1,000 frames: the leader, holding the writer connection and the
// lock file, copies the WAL's pages into the database and fsyncs both
// files, and every reader and writer of the process waits (a few
// milliseconds, about once per 200 group commits at 8 job workers). Here
// the writer connection's automatic checkpoint is off and the checkpoint
// goroutine, on its own connection, runs a PASSIVE checkpoint about every
// 4,000 WAL frames (counted in group commits, at the frames per
// commit the last checkpoint saw), concurrently with readers and writers.
//
// A passive checkpoint that runs alongside writers never catches up with
// the WAL's end, and SQLite only starts the WAL over (instead of growing
// it) when a write begins after a checkpoint that copied every frame. So
// once the WAL holds twice that, the checkpoint goroutine
// takes the write lock (in-process and the lock file) and checkpoints the
// frames written since its passive pass: few, so writers wait briefly.

const (
	// ckptEvery is how many group commits pass before the first
	// checkpoint; later ones adapt (within ckptEveryMin..ckptEveryMax).
	ckptEvery, ckptEveryMin, ckptEveryMax = 64, 8, 1024
	// ckptTargetFrames is how many new WAL frames a checkpoint aims to
	// copy (Options.ckptFrames in tests). Larger than SQLite's automatic
	// interval (1,000): pages written again and again (the commit
	// counter's, the newest activity entries') are copied once per
	// checkpoint. A checkpoint completes under the write lock so that the
	// WAL starts over from twice this length (32 MB of 4 KB pages).
	ckptTargetFrames = 4000
	// ckptTargetFramesFull is the target with kv.DurabilityFull, where every
	// commit fsyncs the WAL: a short WAL is rewritten in place, a long
	// one grows for longer, and an fsync that grows the file costs more.
	ckptTargetFramesFull = 1000
)

// kickCheckpoint is called by the leader after each committed batch.
//
// The WAL's length is bounded in group commits, not in time: when the
// checkpoint goroutine has not yet taken the previous kick, the leader lets
// one more interval pass and then waits for it to take the kick (it is
// scheduled late on a loaded machine, or its last pass is slow). Without
// that wait, a writer that outruns the checkpoint goroutine grows the WAL
// as far as the OS scheduler lets it. The wait holds no lock the
// checkpoint goroutine needs, and it costs a commit only when a checkpoint
// pass takes longer than two intervals of writes.
func (db *DB) kickCheckpoint() {
	db.sinceCkpt++
	if db.sinceCkpt < db.ckptEvery.Load() {
		return
	}
	db.sinceCkpt = 0
	select {
	case db.ckptKick <- struct{}{}:
		db.ckptBehind = false
		return
	default:
	}
	if !db.ckptBehind {
		db.ckptBehind = true
		return
	}
	db.ckptBehind = false
	select {
	case db.ckptKick <- struct{}{}:
	case <-db.closing:
	}
}

// checkpointLoop is the DB's checkpoint goroutine.
func (db *DB) checkpointLoop() {
	defer db.done.Done()
	var c *cconn
	var st *cstmt
	defer func() {
		if c != nil {
			c.close()
		}
	}()
	// What the last checkpoint saw: the WAL's length, whether it started
	// the WAL over, and the group commits made so far.
	var lastFrames, lastBatches int64
	lastRestart := true
	target := int64(db.opts.ckptFrames)
	for {
		select {
		case <-db.closing:
			return
		case <-db.ckptKick:
		}
		if c == nil {
			var err error
			if c, err = openConn(db.path, db.opts.BusyTimeout); err == nil {
				st, err = c.prepare("PRAGMA wal_checkpoint(PASSIVE)")
			}
			if err != nil {
				db.log.Error().Err(err).Msg("checkpoint connection")
				if c != nil {
					c.close()
					c = nil
				}
				continue
			}
		}
		start := time.Now()
		batches := db.batches.Load()
		busy, frames, copied, err := checkpoint(st)
		if err != nil {
			db.log.Error().Err(err).Msg("checkpoint")
			continue
		}
		newFrames := frames - lastFrames
		if lastRestart || newFrames < 0 {
			newFrames = frames
		}
		if n := batches - lastBatches; n > 0 && newFrames > 0 {
			// Kick the next one after about target frames, at most
			// twice as late as the last one: a frame count that misread
			// a restart must not stretch the interval past the bound.
			every := min(target*n/newFrames, 2*db.ckptEvery.Load())
			db.ckptEvery.Store(min(max(every, ckptEveryMin), ckptEveryMax))
		}
		// A pass that copied every frame lets the next write start the
		// WAL over: count the next pass's frames from zero.
		lastFrames, lastBatches = frames, batches
		lastRestart = !busy && frames > 0 && copied == frames
		restarted := false
		if !busy && frames >= 2*target {
			db.fileMu.Lock()
			if err := db.lockFile(nil); err != nil {
				db.fileMu.Unlock()
				db.log.Error().Err(err).Msg("checkpoint")
				continue
			}
			_, _, _, err = checkpoint(st)
			db.unlockFile()
			db.fileMu.Unlock()
			if err != nil {
				db.log.Error().Err(err).Msg("checkpoint")
				continue
			}
			restarted = true
			lastRestart = true
		}
		db.log.Debug().Bool("busy", busy).Int64("frames", frames).Bool("complete", restarted).
			Dur("took", time.Since(start)).Msg("checkpoint")
		if restarted {
			db.ckptComplete.Add(1)
		}
		select {
		case db.ckptDone <- struct{}{}:
		default:
		}
	}
}

// checkpoint runs st (PRAGMA wal_checkpoint) and returns whether another
// checkpoint was running, the WAL's length in frames and how many of them
// are now copied into the database.
func checkpoint(st *cstmt) (busy bool, frames, copied int64, err error) {
	defer st.reset()
	row, err := st.step()
	if err != nil || !row {
		return false, 0, 0, err
	}
	return st.int64Col(0) != 0, st.int64Col(1), st.int64Col(2), nil
}
