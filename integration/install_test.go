package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
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
// <dataDir>/http.addr. env replaces the environment; cred, when set, is
// the user and group it runs as.
func startDaemon(t *testing.T, argv, env []string, dataDir string, cred *syscall.Credential) *daemon {
	t.Helper()
	d := &daemon{t: t, logs: &syncBuffer{}, exited: make(chan struct{})}
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	d.cmd.Env = env
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
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
	d := startDaemon(t, argv, env, data, nil)

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

// repoRoot is the repository the tests run in (make runs there).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "Makefile")); err != nil {
		t.Fatalf("no Makefile in %s: %v", root, err)
	}
	return root
}

// runIn runs name args in dir with the environment less an outer make's
// variables (a `make test` above us), and returns its combined output; a
// failure fails the test.
func runIn(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	out, err := runInErr(dir, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func runInErr(dir, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "MAKEFLAGS" && k != "MFLAGS" && k != "MAKELEVEL" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// needTool fails (never skips) when a tool the test drives is missing.
func needTool(t *testing.T, name, hint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found (%v): %s", name, err, hint)
	}
	return p
}

// verifyUnit runs systemd-analyze verify on an installed unit: it must
// exit 0 and say nothing (an unknown key or a missing ExecStart binary is
// only a warning line on stderr).
func verifyUnit(t *testing.T, unit string) {
	t.Helper()
	needTool(t, "systemd-analyze", "make testdeps installs it (Debian's systemd package: apt-get install systemd)")
	out, err := runInErr(filepath.Dir(unit), "systemd-analyze", "verify", unit)
	if err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("systemd-analyze verify %s: %v\n%s", unit, err, out)
	}
}

var revisionRE = regexp.MustCompile(`revision ([0-9a-f]{40})\b`)

// checkBuild checks that a shipped binary says its VCS revision (a commit
// of this repository) in --version, and was built with -trimpath.
func checkBuild(t *testing.T, repo, bin string) {
	t.Helper()
	out := runIn(t, repo, bin, "--version")
	m := revisionRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("%s --version shows no revision: %q", bin, out)
	}
	runIn(t, repo, "git", "cat-file", "-e", m[1]+"^{commit}")
	if info := runIn(t, repo, "go", "version", "-m", bin); !strings.Contains(info, "-trimpath=true") {
		t.Fatalf("%s not built with -trimpath:\n%s", bin, info)
	}
}

// treeFiles lists the regular files under root, relative, with their modes.
func treeFiles(t *testing.T, root string) map[string]fs.FileMode {
	t.Helper()
	files := map[string]fs.FileMode{}
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		files["/"+rel] = fi.Mode()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// shipped is what make install lays out under a PREFIX (and the config
// under SYSCONFDIR), with each file's mode and a line it must hold.
func shipped(prefix, sysconf, zshDir string) map[string]struct {
	mode fs.FileMode
	has  string
} {
	type f = struct {
		mode fs.FileMode
		has  string
	}
	return map[string]f{
		prefix + "/bin/couchrepd":                                    {0o755, ""},
		prefix + "/bin/couchrepctl":                                  {0o755, ""},
		prefix + "/lib/systemd/system/couchrepd.service":             {0o644, "ExecStart=" + prefix + "/bin/couchrepd --config " + sysconf + "/couchrep/couchrep.ini --data /var/lib/couchrep\n"},
		sysconf + "/couchrep/couchrep.ini":                           {0o644, "[admins]\n"},
		prefix + "/share/bash-completion/completions/couchrepctl":    {0o644, "complete -F _couchrepctl couchrepctl"},
		zshDir + "/_couchrepctl":                                     {0o644, "#compdef couchrepctl\n"},
		prefix + "/share/fish/vendor_completions.d/couchrepctl.fish": {0o644, "complete -c couchrepctl"},
	}
}

// TestInstallMake (issue 24, Installable): make install DESTDIR=... lays
// out exactly the binaries (with their VCS revision, -trimpath), the
// systemd unit (ExecStart following PREFIX and SYSCONFDIR), the config and
// the bash/zsh/fish completion; run again it keeps an edited config and
// installs the rest again. Installed with a PREFIX of its own, the unit
// passes systemd-analyze verify, binary path included.
func TestInstallMake(t *testing.T) {
	skipShort(t)
	repo := repoRoot(t)
	tmp := t.TempDir()
	release := "RELEASE_BIN=" + filepath.Join(tmp, "bin")
	dest := filepath.Join(tmp, "dest")
	runIn(t, repo, "make", "--no-print-directory", "install", "DESTDIR="+dest, release)

	want := shipped("/usr/local", "/etc", "/usr/local/share/zsh/site-functions")
	got := treeFiles(t, dest)
	for path, w := range want {
		mode, ok := got[path]
		if !ok {
			t.Errorf("make install did not install %s (installed: %v)", path, got)
			continue
		}
		if mode.Perm() != w.mode {
			t.Errorf("%s: mode %v, want %v", path, mode.Perm(), w.mode)
		}
		if b, err := os.ReadFile(filepath.Join(dest, path)); err != nil || !strings.Contains(string(b), w.has) {
			t.Errorf("%s does not hold %q (%v)", path, w.has, err)
		}
	}
	for path := range got {
		if _, ok := want[path]; !ok {
			t.Errorf("make install installed %s too", path)
		}
	}
	orig, err := os.ReadFile(filepath.Join(repo, "couchrep.ini"))
	if err != nil {
		t.Fatal(err)
	}
	ini := filepath.Join(dest, "etc/couchrep/couchrep.ini")
	if b, _ := os.ReadFile(ini); !bytes.Equal(b, orig) {
		t.Errorf("installed config differs from the repository's couchrep.ini")
	}
	for _, bin := range []string{"couchrepd", "couchrepctl"} {
		checkBuild(t, repo, filepath.Join(dest, "usr/local/bin", bin))
	}

	// Again, over an edited config: kept; the rest installed again.
	edited := append(slices.Clone(orig), "\n; edited by the operator\n"...)
	if err := os.WriteFile(ini, edited, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dest, "usr/local/bin/couchrepctl")); err != nil {
		t.Fatal(err)
	}
	out := runIn(t, repo, "make", "--no-print-directory", "install", "DESTDIR="+dest, release)
	if b, _ := os.ReadFile(ini); !bytes.Equal(b, edited) {
		t.Errorf("a second make install replaced the edited config:\n%s", out)
	}
	if !strings.Contains(out, "kept "+ini) {
		t.Errorf("a second make install does not say it kept the config:\n%s", out)
	}
	if got := treeFiles(t, dest); len(got) != len(want) {
		t.Errorf("after a second make install: %v, want %d files", got, len(want))
	}

	// With real paths (a PREFIX and SYSCONFDIR of its own, no DESTDIR), the
	// unit verifies: every key known, ExecStart's binary there.
	prefix, sysconf := filepath.Join(tmp, "prefix"), filepath.Join(tmp, "etc")
	runIn(t, repo, "make", "--no-print-directory", "install", "PREFIX="+prefix, "SYSCONFDIR="+sysconf, release)
	own := shipped(prefix, sysconf, prefix+"/share/zsh/site-functions")
	unit := prefix + "/lib/systemd/system/couchrepd.service"
	if b, err := os.ReadFile(unit); err != nil || !strings.Contains(string(b), own[unit].has) {
		t.Fatalf("unit with PREFIX=%s: no %q (%v)", prefix, own[unit].has, err)
	}
	verifyUnit(t, unit)
}

// dpkg runs dpkg (or dpkg-query) as root, waiting out another process's
// dpkg lock (make testdeps of another job may be installing): up to 10
// minutes, trying again every 5 s.
func dpkg(t *testing.T, args ...string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		out, err := runInErr("/", "dpkg", args...)
		if err == nil {
			return out
		}
		if !dpkgLocked.MatchString(out) || time.Now().After(deadline) {
			t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("dpkg %s: locked, trying again in 5 s: %s", strings.Join(args, " "), strings.TrimSpace(out))
		<-time.After(5 * time.Second)
	}
}

// dpkgLocked matches dpkg's refusal while another process holds its lock.
var dpkgLocked = regexp.MustCompile(`lock was locked by another process|database is locked by another process`)

// debStatus is dpkg's status of the couchrep package ("" when unknown).
func debStatus() string {
	out, err := runInErr("/", "dpkg-query", "-W", "-f=${Status}", "couchrep")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}

// processesOf lists the pids whose executable is exe.
func processesOf(t *testing.T, exe string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if link, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && strings.TrimSuffix(link, " (deleted)") == exe {
			pids = append(pids, pid)
		}
	}
	return pids
}

// debFiles are the package's files on the system (zsh completion where
// Debian's zsh looks).
var debFiles = shipped("/usr", "/etc", "/usr/share/zsh/vendor-completions")

// TestInstallDeb (issue 24, Installable): make deb builds a package that
// dpkg -i installs on this system (we are root, CI is a throwaway machine):
// the files of make install PREFIX=/usr, the config as a conffile readable
// by the couchrep group only, a couchrep system user and /var/lib/couchrep,
// nothing started. The installed couchrepd runs, as the couchrep user,
// with the installed config and a data directory of the test's: /_up
// answers, the installed couchrepctl reaches it, SIGTERM stops it. dpkg -r
// removes the files but the config and data; dpkg --purge those too. The
// whole cycle runs twice (the user exists the second time, as purge keeps
// it) with a reinstall over the installed package. A couchrep package and
// user found on the machine (an earlier interrupted run) are removed first,
// and again at the end.
func TestInstallDeb(t *testing.T) {
	skipShort(t)
	if os.Geteuid() != 0 {
		t.Fatalf("TestInstallDeb installs a Debian package on this system: run it as root (CI does, on a throwaway machine)")
	}
	needTool(t, "dpkg", "a Debian system's package manager")
	repo := repoRoot(t)
	tmp := t.TempDir()
	deb := filepath.Join(tmp, "couchrep.deb")
	runIn(t, repo, "make", "--no-print-directory", "deb", "DEB_FILE="+deb, "DEB_ROOT="+filepath.Join(tmp, "root"), "RELEASE_BIN="+filepath.Join(tmp, "bin"))

	// A clean slate, so that round 1 sees postinst create the user; and
	// none left behind.
	clean := func() {
		if st := debStatus(); st != "" && !strings.HasPrefix(st, "unknown ") && st != "deinstall ok not-installed" {
			t.Logf("couchrep package present (%s): purging it", st)
			dpkg(t, "--purge", "couchrep")
		}
		if _, err := user.Lookup("couchrep"); err == nil {
			runIn(t, "/", "userdel", "couchrep")
		}
		if _, err := user.LookupGroup("couchrep"); err == nil {
			runIn(t, "/", "groupdel", "couchrep")
		}
	}
	clean()
	t.Cleanup(clean)

	for round := 1; round <= 2; round++ {
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			dpkg(t, "-i", deb)
			if round == 2 {
				dpkg(t, "-i", deb) // over the installed package: postinst configure again
			}
			if st := debStatus(); st != "install ok installed" {
				t.Fatalf("dpkg status %q after dpkg -i", st)
			}
			checkInstalledDeb(t, repo)
			runInstalledDaemon(t)

			dpkg(t, "-r", "couchrep")
			if st := debStatus(); st != "deinstall ok config-files" {
				t.Fatalf("dpkg status %q after dpkg -r", st)
			}
			for path := range debFiles {
				_, err := os.Stat(path)
				if keep := path == "/etc/couchrep/couchrep.ini"; keep != (err == nil) {
					t.Errorf("after dpkg -r: %s there = %v, want %v", path, err == nil, keep)
				}
			}
			if _, err := os.Stat("/var/lib/couchrep"); err != nil {
				t.Errorf("dpkg -r removed /var/lib/couchrep (%v): remove keeps the data", err)
			}

			dpkg(t, "--purge", "couchrep")
			if st := debStatus(); st != "" && st != "deinstall ok not-installed" && !strings.HasPrefix(st, "unknown ") {
				t.Fatalf("dpkg status %q after dpkg --purge", st)
			}
			for _, path := range []string{"/etc/couchrep", "/var/lib/couchrep", "/usr/bin/couchrepd", "/usr/lib/systemd/system/couchrepd.service"} {
				if _, err := os.Stat(path); !os.IsNotExist(err) {
					t.Errorf("after dpkg --purge: %s still there (%v)", path, err)
				}
			}
		})
		if t.Failed() {
			return
		}
	}
}

// checkInstalledDeb checks what dpkg -i left on the system.
func checkInstalledDeb(t *testing.T, repo string) {
	t.Helper()
	for path, w := range debFiles {
		if path == "/etc/couchrep/couchrep.ini" {
			w.mode = 0o640
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Errorf("not installed: %s (%v)", path, err)
			continue
		}
		if fi.Mode().Perm() != w.mode {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), w.mode)
		}
		if b, err := os.ReadFile(path); err != nil || !strings.Contains(string(b), w.has) {
			t.Errorf("%s does not hold %q (%v)", path, w.has, err)
		}
	}
	listed := dpkg(t, "-L", "couchrep")
	for path := range debFiles {
		if !strings.Contains(listed, path+"\n") {
			t.Errorf("dpkg -L couchrep does not list %s", path)
		}
	}
	if cf, _ := runInErr("/", "dpkg-query", "-W", "-f=${Conffiles}", "couchrep"); !strings.Contains(cf, "/etc/couchrep/couchrep.ini ") {
		t.Errorf("/etc/couchrep/couchrep.ini is not a conffile: %q", cf)
	}
	u, err := user.Lookup("couchrep")
	if err != nil {
		t.Fatalf("postinst made no couchrep user: %v", err)
	}
	if u.HomeDir != "/var/lib/couchrep" {
		t.Errorf("couchrep's home is %s", u.HomeDir)
	}
	for _, c := range []struct {
		path string
		mode fs.FileMode
		uid  string
		gid  string
	}{
		{"/var/lib/couchrep", fs.ModeDir | 0o750, u.Uid, u.Gid},
		{"/etc/couchrep/couchrep.ini", 0o640, "0", u.Gid},
	} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Errorf("%s: %v", c.path, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != c.mode || strconv.Itoa(int(st.Uid)) != c.uid || strconv.Itoa(int(st.Gid)) != c.gid {
			t.Errorf("%s: %v %d:%d, want %v %s:%s", c.path, fi.Mode(), st.Uid, st.Gid, c.mode, c.uid, c.gid)
		}
	}
	if pids := processesOf(t, "/usr/bin/couchrepd"); len(pids) > 0 {
		t.Errorf("installing the package started couchrepd: pids %v", pids)
	}
	for _, bin := range []string{"/usr/bin/couchrepd", "/usr/bin/couchrepctl"} {
		checkBuild(t, repo, bin)
	}
	verifyUnit(t, "/usr/lib/systemd/system/couchrepd.service")
}

// runInstalledDaemon starts /usr/bin/couchrepd as the couchrep user with
// the installed config (its ports moved to free ones) and a data directory
// of the test's, checks /_up and the installed couchrepctl, and stops it.
func runInstalledDaemon(t *testing.T) {
	t.Helper()
	u, err := user.Lookup("couchrep")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	base, err := os.MkdirTemp("", "couchrep-deb-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	data := filepath.Join(base, "data")
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(data, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(data, uid, gid); err != nil {
		t.Fatal(err)
	}
	argv := []string{"/usr/bin/couchrepd", "--config", "/etc/couchrep/couchrep.ini", "--data", data,
		"--http", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--node-name", "deb-test"}
	env := []string{"PATH=/usr/bin:/bin", "HOME=" + data}
	d := startDaemon(t, argv, env, data, &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}})
	status, body := d.get("/_up", "", "")
	if status != http.StatusOK || !strings.Contains(string(body), `"status":"ok"`) {
		t.Fatalf("GET /_up: %d %s", status, body)
	}
	admin, err := os.ReadFile(filepath.Join(data, "admin.addr"))
	if err != nil {
		t.Fatal(err)
	}
	if out := runIn(t, "/", "/usr/bin/couchrepctl", "--node", strings.TrimSpace(string(admin)), "nodes"); !strings.Contains(out, "deb-test") {
		t.Fatalf("couchrepctl nodes does not list the node:\n%s", out)
	}
	d.stop()
}
