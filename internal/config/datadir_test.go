package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

func TestComplete(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	c := Default()
	c.Couchrep.DataDir = dir
	if err := c.Complete(); err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "couchrep.db"); c.Couchrep.Store != want {
		t.Errorf("Store = %q, want %q", c.Couchrep.Store, want)
	}
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(c.CouchDB.UUID) {
		t.Errorf("UUID = %q, want 32 lowercase hex digits", c.CouchDB.UUID)
	}
	if !regexp.MustCompile(`^couchrep-[0-9a-f]{8}@[^.\s]+$`).MatchString(c.Couchrep.NodeName) {
		t.Errorf("NodeName = %q, want couchrep-<8 hex>@<host>", c.Couchrep.NodeName)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("completed config invalid: %v", err)
	}

	// A restart with the same data directory keeps both.
	again := Default()
	again.Couchrep.DataDir = dir
	if err := again.Complete(); err != nil {
		t.Fatal(err)
	}
	if again.CouchDB.UUID != c.CouchDB.UUID || again.Couchrep.NodeName != c.Couchrep.NodeName {
		t.Errorf("after restart: uuid %q name %q; want %q %q", again.CouchDB.UUID, again.Couchrep.NodeName, c.CouchDB.UUID, c.Couchrep.NodeName)
	}

	// Another data directory: another node name and UUID.
	other := Default()
	other.Couchrep.DataDir = filepath.Join(t.TempDir(), "other")
	if err := other.Complete(); err != nil {
		t.Fatal(err)
	}
	if other.CouchDB.UUID == c.CouchDB.UUID || other.Couchrep.NodeName == c.Couchrep.NodeName {
		t.Errorf("two data directories share uuid %q or name %q", c.CouchDB.UUID, c.Couchrep.NodeName)
	}

	// Explicit settings are kept and nothing is derived for them.
	set := Default()
	set.Couchrep.DataDir = filepath.Join(t.TempDir(), "set")
	set.Couchrep.Store, set.CouchDB.UUID, set.Couchrep.NodeName = "/x.db", "u", "n@h"
	if err := set.Complete(); err != nil {
		t.Fatal(err)
	}
	if set.Couchrep.Store != "/x.db" || set.CouchDB.UUID != "u" || set.Couchrep.NodeName != "n@h" {
		t.Errorf("explicit settings changed: %+v %+v", set.Couchrep, set.CouchDB)
	}
	if _, err := os.Stat(filepath.Join(set.Couchrep.DataDir, UUIDFile)); !os.IsNotExist(err) {
		t.Errorf("uuid file written although [couchdb] uuid is set (stat: %v)", err)
	}
}

// TestEnsureUUIDConcurrent starts many first calls at once: all must
// return the same UUID, the one on disk.
func TestEnsureUUIDConcurrent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const n = 16
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { ids[i], errs[i] = EnsureUUID(dir) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if ids[i] != ids[0] {
			t.Fatalf("call %d got %q, call 0 got %q", i, ids[i], ids[0])
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, UUIDFile))
	if err != nil || strings.TrimSpace(string(b)) != ids[0] {
		t.Errorf("file holds %q (%v), want %q", b, err, ids[0])
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Errorf("data directory holds %d entries (%v), want only %s", len(entries), err, UUIDFile)
	}
}

func TestEnsureUUIDCorrupt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, UUIDFile), []byte("not hex\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := EnsureUUID(dir)
	if err == nil || !strings.Contains(err.Error(), UUIDFile) || !strings.Contains(err.Error(), "expected 32 hex digits") {
		t.Errorf("EnsureUUID(corrupt) = %v, want an error naming the file and the expectation", err)
	}
}

func TestAdoptUUID(t *testing.T) {
	dir := t.TempDir()
	gen, err := EnsureUUID(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, uuid := range []string{"35f718cc-654e-4c7a-8354-02a780069677", "0123456789abcdef0123456789abcdef"} {
		if err := AdoptUUID(dir, uuid); err != nil {
			t.Fatalf("AdoptUUID(%q): %v", uuid, err)
		}
		if got, err := EnsureUUID(dir); err != nil || got != uuid || got == gen {
			t.Fatalf("EnsureUUID after AdoptUUID(%q) = %q, %v", uuid, got, err)
		}
	}
	if err := AdoptUUID(dir, "has space"); err == nil || !strings.Contains(err.Error(), "uuid") {
		t.Fatalf("AdoptUUID with a space: %v, want an error naming uuid", err)
	}
}
