package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/internal/config"
)

// TestAdoptBareUUID: --adopt-uuid takes a uuid as given and records it in
// the data directory; something that looks like a server is never taken
// for a uuid.
func TestAdoptBareUUID(t *testing.T) {
	const uuid = "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		from    string
		want    string // the uuid adopted ("" an error)
		errText string
	}{
		{from: uuid, want: uuid},
		{from: "localhost:5984", errText: "localhost:5984"},
		{from: "couchdb.example.com", errText: "couchdb.example.com"},
	} {
		t.Run(tc.from, func(t *testing.T) {
			cfg := config.Default()
			cfg.Couchrep.DataDir = t.TempDir()
			err := adoptUUID(t.Context(), &cfg, tc.from, zerolog.Nop())
			if tc.want == "" {
				if err == nil || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("adopt %q: %v, want an error naming it", tc.from, err)
				}
				return
			}
			b, rerr := os.ReadFile(filepath.Join(cfg.Couchrep.DataDir, config.UUIDFile))
			if err != nil || rerr != nil || strings.TrimSpace(string(b)) != tc.want || cfg.CouchDB.UUID != tc.want || !cfg.CouchDB.Adopted {
				t.Fatalf("adopt %q: %v; file %q (%v), config %q adopted %v; want %q", tc.from, err, b, rerr, cfg.CouchDB.UUID, cfg.CouchDB.Adopted, tc.want)
			}
		})
	}
}

// TestPrintUUIDChange: the stderr note of an adopted uuid lists the old and
// new uuid, the count and every job id.
func TestPrintUUIDChange(t *testing.T) {
	var b bytes.Buffer
	printUUIDChange(&b, couchrep.UUIDChange{From: "old", To: "new", Jobs: []string{"j1", "j2"}})
	out := b.String()
	for _, want := range []string{"from old to new", "2 unfinished job(s) restart from zero", "\n  j1\n  j2\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("%q does not say %q", out, want)
		}
	}
}
