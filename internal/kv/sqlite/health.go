package sqlite

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
)

// Check reports whether the store's file is still an SQLite file: a process
// serving reads from its warm page cache would otherwise not notice that
// the file under it was overwritten or removed. It reads the file's 16-byte
// header only, so callers may run it at every heartbeat (kv.Checker).
func (db *DB) Check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f, err := os.Open(db.path)
	if err != nil {
		return fmt.Errorf("sqlite: check %s: %w", db.path, err)
	}
	defer f.Close()
	hdr := make([]byte, 16)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return fmt.Errorf("sqlite: check %s: %w (header unreadable: %w)", db.path, ErrNotStore, err)
	}
	if !bytes.Equal(hdr, []byte("SQLite format 3\x00")) {
		return fmt.Errorf("sqlite: check %s: %w (the file is no longer an SQLite file)", db.path, ErrNotStore)
	}
	return nil
}
