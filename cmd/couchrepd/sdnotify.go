package main

import (
	"context"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/messages"
)

// sdNotify sends state ("READY=1", "WATCHDOG=1", "STOPPING=1", ...) to
// systemd's notification socket, $NOTIFY_SOCKET (sd_notify(3)); without it
// (not started by systemd with Type=notify) it does nothing.
func sdNotify(state string) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	if path[0] == '@' { // an abstract socket
		path = "\x00" + path[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Write([]byte(state))
	return err
}

// watchdogInterval is how often to send WATCHDOG=1: half of
// $WATCHDOG_USEC (systemd's WatchdogSec), or 0 when no watchdog is set for
// this process.
func watchdogInterval() time.Duration {
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return time.Duration(usec) * time.Microsecond / 2
}

// watchdog sends WATCHDOG=1 every interval while the node's supervision
// tree answers a tree request within the interval: a node whose actors hang
// stops petting the watchdog, and systemd restarts it.
func watchdog(ctx context.Context, node *couchrep.Node, interval time.Duration, log zerolog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-node.Done():
			return
		case <-t.C:
		}
		c, cancel := context.WithTimeout(ctx, interval)
		_, err := node.Request(c, &messages.TreeRequest{})
		cancel()
		if err != nil {
			log.Warn().Err(err).Msg("watchdog: the supervision tree did not answer; not notifying systemd")
			continue
		}
		if err := sdNotify("WATCHDOG=1"); err != nil {
			log.Warn().Err(err).Msg("watchdog: sd_notify")
		}
	}
}
