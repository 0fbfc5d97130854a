package cluster

import (
	"context"
	"crypto/rand"
	"fmt"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
)

// SessionSecretBytes is the length of the secret that signs the HTTP API's
// session cookies.
const SessionSecretBytes = 32

// sessionSecretKey is where the store keeps the HTTP API's cookie secret,
// next to the shared server uuid.
var sessionSecretKey = tuple.Tuple{"couchrep", "session_secret"}.Pack()

// SessionSecret returns the secret every node sharing db signs and checks
// the HTTP API's AuthSession cookies with, so that a cookie one node issued
// is accepted by all. The first node to ask makes it (random bytes) in the
// same transaction that found none; later nodes read it.
func SessionSecret(ctx context.Context, db kv.Database) ([]byte, error) {
	var out []byte
	err := db.Transact(ctx, func(tx kv.Tx) error {
		got, err := tx.Get(sessionSecretKey)
		if err != nil {
			return err
		}
		if len(got) == SessionSecretBytes {
			out = append([]byte(nil), got...)
			return nil
		}
		secret := make([]byte, SessionSecretBytes)
		if _, err := rand.Read(secret); err != nil {
			return err
		}
		tx.Set(sessionSecretKey, secret)
		out = secret
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: session secret in the job store: %w", err)
	}
	return out, nil
}
