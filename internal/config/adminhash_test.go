package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHashAdminsFileNotWritable: a config file that cannot be rewritten
// (gone, a read-only directory for a non-root user) is an error wrapping
// ErrAdminsNotRewritten that names the file and no password, after every
// plain password was hashed in memory: the node can start with them.
func TestHashAdminsFileNotWritable(t *testing.T) {
	t.Parallel()
	const secret = "pl4in-secret"
	for _, c := range []struct {
		name  string
		spoil func(t *testing.T, dir, path string)
		root  bool // meaningful when running as root
	}{
		{"file gone", func(t *testing.T, dir, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"read-only directory and file", func(t *testing.T, dir, path string) {
			if err := os.Chmod(path, 0o444); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, 0o555); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.Chmod(dir, 0o755) })
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !c.root && os.Geteuid() == 0 {
				t.Skip("root writes through permission bits: TestInstallReadOnlyConfig covers a read-only mount")
			}
			dir := filepath.Join(t.TempDir(), "etc")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "couchrep.ini")
			orig := "[admins]\nadmin = " + secret + "\n"
			if err := os.WriteFile(path, []byte(orig), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			c.spoil(t, dir, path)
			names, files, err := cfg.HashAdmins(func(p string) (string, error) { return "-pbkdf2-h(" + strings.ToUpper(p) + "),s,1", nil })
			if !errors.Is(err, ErrAdminsNotRewritten) || !strings.Contains(err.Error(), path) || strings.Contains(err.Error(), secret) {
				t.Fatalf("err = %v, want ErrAdminsNotRewritten naming %s and no password", err, path)
			}
			if strings.Join(names, ",") != "admin" || len(files) != 0 {
				t.Fatalf("hashed %v, rewrote %v", names, files)
			}
			if got := cfg.Admins["admin"]; got != "-pbkdf2-h("+strings.ToUpper(secret)+"),s,1" {
				t.Fatalf("admin in memory = %q, want the hash", got)
			}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if e.Name() != "couchrep.ini" {
					t.Errorf("left %s in the config directory", e.Name())
				}
			}
		})
	}
}
