package integration

import (
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSystemdNotify runs couchrepd as deploy/systemd/couchrepd.service does
// (Type=notify, WatchdogSec): it reports READY=1 once up, pets the watchdog,
// and on SIGTERM reports STOPPING=1 and exits cleanly within its shutdown
// timeout (60 s; the unit's TimeoutStopSec is above it).
func TestSystemdNotify(t *testing.T) {
	skipShort(t)
	sock := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msgs := make(chan string, 64)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(buf[:n])
		}
	}()
	n := startNode(t, nodeOptions{env: []string{"NOTIFY_SOCKET=" + sock, "WATCHDOG_USEC=400000"}})
	await := func(what string) string {
		t.Helper()
		timeout := time.After(time.Minute)
		for {
			select {
			case m := <-msgs:
				if strings.Contains(m, what) {
					return m
				}
			case <-timeout:
				t.Fatalf("no %s from couchrepd within a minute:\n%s", what, n.logs.String())
			}
		}
	}
	if m := await("READY=1"); !strings.Contains(m, "STATUS=node ") {
		t.Fatalf("READY message %q has no STATUS", m)
	}
	await("WATCHDOG=1")
	await("WATCHDOG=1")
	if err := n.stop(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("couchrepd after SIGTERM: %v", err)
	}
	await("STOPPING=1")
}
