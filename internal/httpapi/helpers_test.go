package httpapi_test

import (
	"crypto/pbkdf2"
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"testing"
)

// pbkdf2Hash is CouchDB's "-pbkdf2-<key>,<salt>,<iterations>" (SHA-1, 20 bytes).
func pbkdf2Hash(t *testing.T, password, salt string, iter int) string {
	t.Helper()
	k, err := pbkdf2.Key(sha1.New, password, []byte(salt), iter, 20)
	if err != nil {
		t.Fatal(err)
	}
	return "-pbkdf2-" + hex.EncodeToString(k) + "," + salt + "," + strconv.Itoa(iter)
}

func sha1Hex(s string) string {
	h := sha1.Sum([]byte(s))
	return hex.EncodeToString(h[:])
}
