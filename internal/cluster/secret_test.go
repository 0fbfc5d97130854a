package cluster

import (
	"bytes"
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/couchrep/couchrep/internal/kv/sqlite"
)

// TestSessionSecret: the first call makes the secret, every later call (a
// second node on the same store file, concurrent first calls) gets the same
// bytes.
func TestSessionSecret(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.db")
	db, err := sqlite.Open(context.Background(), path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := t.Context()
	secrets := make([][]byte, 8)
	var wg sync.WaitGroup
	for i := range secrets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := SessionSecret(ctx, db)
			if err != nil {
				t.Error(err)
			}
			secrets[i] = s
		}()
	}
	wg.Wait()
	if len(secrets[0]) != SessionSecretBytes || bytes.Equal(secrets[0], make([]byte, SessionSecretBytes)) {
		t.Fatalf("secret = %x, want %d random bytes", secrets[0], SessionSecretBytes)
	}
	for i, s := range secrets {
		if !bytes.Equal(s, secrets[0]) {
			t.Fatalf("call %d got another secret", i)
		}
	}
	// A second node opening the same store reads the same secret.
	db2, err := sqlite.Open(context.Background(), path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	s2, err := SessionSecret(ctx, db2)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s2, secrets[0]) {
		t.Fatal("a second node got another secret")
	}
}
