package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// daemon is a couchrepd started by the install tests: the one in binDir, or
// an installed one, with a config file of their own.
type daemon struct {
	t      *testing.T
	cmd    *exec.Cmd
	logs   *syncBuffer
	http   string // host:port of the HTTP API
	exited chan struct{}
	err    error
}

// startDaemon runs argv (couchrepd and its flags, possibly behind a
// wrapper such as unshare) and waits until the node writes
// <dataDir>/http.addr. env replaces the environment.
func startDaemon(t *testing.T, argv, env []string, dataDir string) *daemon {
	t.Helper()
	d := &daemon{t: t, logs: &syncBuffer{}, exited: make(chan struct{})}
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	d.cmd.Env = env
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-d.exited:
		default:
			_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
			<-d.exited
		}
		if t.Failed() {
			t.Logf("%s logs:\n%s", argv[0], d.logs.String())
		}
	})
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for {
		if b, err := os.ReadFile(filepath.Join(dataDir, "http.addr")); err == nil && bytes.HasSuffix(b, []byte("\n")) {
			d.http = strings.TrimSpace(string(b))
			return d
		}
		select {
		case <-d.exited:
			t.Fatalf("couchrepd exited before it was ready (%v):\n%s", d.err, d.logs.String())
		case <-deadline:
			t.Fatalf("couchrepd not ready within a minute:\n%s", d.logs.String())
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (d *daemon) stop() {
	d.t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		d.t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-d.exited:
		if d.err != nil {
			d.t.Fatalf("couchrepd after SIGTERM: %v\n%s", d.err, d.logs.String())
		}
	case <-time.After(75 * time.Second): // the unit's TimeoutStopSec
		d.t.Fatalf("couchrepd did not exit within 75 s of SIGTERM")
	}
}

// get does GET path on the daemon's HTTP API, with Basic credentials when
// user is set, and returns the status and body.
func (d *daemon) get(path, user, password string) (int, []byte) {
	d.t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), "GET", "http://"+d.http+path, nil)
	if err != nil {
		d.t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	cl := http.Client{Timeout: 30 * time.Second}
	resp, err := cl.Do(req)
	if err != nil {
		d.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// filesHolding lists the regular files under the roots whose bytes contain
// secret.
func filesHolding(t *testing.T, secret string, roots ...string) []string {
	t.Helper()
	var found []string
	for _, root := range roots {
		err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if bytes.Contains(b, []byte(secret)) {
				found = append(found, p)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("walking %s: %v", root, err)
		}
	}
	return found
}

// readOnlyArgv wraps argv so that dir is read-only for it, as
// ProtectSystem=strict makes /etc for the systemd unit: for root (who
// writes through permission bits) a read-only bind mount of dir in a mount
// namespace of the process's own (util-linux unshare); for another user
// the permission bits, which the caller set.
func readOnlyArgv(dir string, argv []string) []string {
	if os.Geteuid() != 0 {
		return argv
	}
	return append([]string{"unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", `mount --bind -o ro "$0" "$0" && exec "$@"`, dir}, argv...)
}

// TestInstallReadOnlyConfig (issue 24, finding 7): under the systemd unit
// /etc/couchrep is read-only (ProtectSystem=strict), and a plain [admins]
// password used to stop couchrepd (it could not rewrite the file with the
// hash: exit 1, and Restart=on-failure looped). Now the node starts with
// the password hashed in memory, answers that password (and no other),
// warns naming the file and the admin but never the password, and writes
// the password nowhere: not in the data directory, its temp directory,
// its home, the config directory (left as it was) or its logs.
func TestInstallReadOnlyConfig(t *testing.T) {
	skipShort(t)
	const secret = "Plain-Pw-7f3c9e"
	root := t.TempDir()
	etc, data, tmp, home := filepath.Join(root, "etc"), filepath.Join(root, "data"), filepath.Join(root, "tmp"), filepath.Join(root, "home")
	for _, d := range []string{etc, data, tmp, home} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ini := filepath.Join(etc, "couchrep.ini")
	conf := "[couchrep]\nhttp_bind = 127.0.0.1:0\nadmin_bind = 127.0.0.1:0\n\n[log]\nlevel = debug\nformat = json\n\n[admins]\n; the operator's plain password\nadmin = " + secret + "\n"
	if err := os.WriteFile(ini, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ini, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(etc, 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(etc, 0o755) })

	argv := readOnlyArgv(etc, []string{filepath.Join(binDir, "couchrepd"), "--config", ini, "--data", data, "--node-name", "readonly-etc"})
	env := append(os.Environ(), "TMPDIR="+tmp, "HOME="+home)
	d := startDaemon(t, argv, env, data)

	for _, c := range []struct {
		name, user, password string
		want                 int
	}{
		{"the plain password from the file", "admin", secret, http.StatusOK},
		{"another password", "admin", secret + "x", http.StatusUnauthorized},
		{"no credentials", "", "", http.StatusOK}, // /_session answers an anonymous userCtx
	} {
		t.Run(c.name, func(t *testing.T) {
			status, body := d.get("/_session", c.user, c.password)
			if status != c.want {
				t.Fatalf("GET /_session: %d %s, want %d", status, body, c.want)
			}
			if c.want != http.StatusOK {
				return
			}
			var s struct {
				UserCtx struct {
					Name  *string  `json:"name"`
					Roles []string `json:"roles"`
				} `json:"userCtx"`
			}
			if err := json.Unmarshal(body, &s); err != nil {
				t.Fatalf("GET /_session: %v: %s", err, body)
			}
			isAdmin := s.UserCtx.Name != nil && *s.UserCtx.Name == "admin" && strings.Contains(strings.Join(s.UserCtx.Roles, ","), "_admin")
			if isAdmin != (c.user != "") {
				t.Fatalf("userCtx %s, admin = %v, want %v", body, isAdmin, c.user != "")
			}
		})
	}
	d.stop()

	logs := d.logs.String()
	if !strings.Contains(logs, "hashed in memory only") || !strings.Contains(logs, ini) || !strings.Contains(logs, `"admins":["admin"]`) {
		t.Errorf("no warning naming %s and the admin in the logs:\n%s", ini, logs)
	}
	if strings.Contains(logs, secret) {
		t.Errorf("the password is in the logs:\n%s", logs)
	}
	if got, err := os.ReadFile(ini); err != nil || string(got) != conf {
		t.Errorf("config file changed (%v):\n%s", err, got)
	}
	if entries, err := os.ReadDir(etc); err != nil || len(entries) != 1 {
		t.Errorf("config directory holds %d entries (%v), want the ini alone", len(entries), err)
	}
	if found := filesHolding(t, secret, data, tmp, home); len(found) > 0 {
		t.Errorf("the plain password was written to %v", found)
	}
	if fi, err := os.Stat(filepath.Join(data, "couchrep.db")); err != nil || fi.Size() == 0 {
		t.Fatalf("the node's store is not in %s (%v): the scan for the password looked at nothing", data, err)
	}
}
