package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/httpapi"
)

// TestHashPassword: couchrepd hash-password prints a CouchDB [admins] hash
// of stdin's first line that the HTTP API accepts for that password (and
// for no other), never the password itself; no password is an error.
func TestHashPassword(t *testing.T) {
	for _, c := range []struct {
		name, stdin, password string
		args                  []string
		code                  int
	}{
		{name: "line", stdin: "s3cret-Pw\n", password: "s3cret-Pw"},
		{name: "crlf", stdin: "s3cret-Pw\r\n", password: "s3cret-Pw"},
		{name: "no line end", stdin: "s3cret-Pw", password: "s3cret-Pw"},
		{name: "spaces inside, more lines", stdin: "two words\nignored\n", password: "two words"},
		{name: "empty", stdin: "", code: 2},
		{name: "empty line", stdin: "\nlater\n", code: 2},
		{name: "password as argument", stdin: "x\n", args: []string{"s3cret-Pw"}, code: 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := runHashPassword(c.args, strings.NewReader(c.stdin), &out, &errOut)
			if code != c.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, c.code, errOut.String())
			}
			secret := "s3cret-Pw"
			if strings.Contains(out.String()+errOut.String(), secret) {
				t.Fatalf("the password is in the output: %q %q", out.String(), errOut.String())
			}
			if c.code != 0 {
				if out.Len() != 0 || errOut.Len() == 0 {
					t.Fatalf("failure printed %q, stderr %q", out.String(), errOut.String())
				}
				return
			}
			h := strings.TrimSuffix(out.String(), "\n")
			if !config.IsPasswordHash(h) || strings.ContainsAny(h, " \n") {
				t.Fatalf("printed %q, want one -pbkdf2- hash", out.String())
			}
			if !httpapi.PasswordMatches(h, c.password) {
				t.Fatalf("hash %q does not match %q", h, c.password)
			}
			if httpapi.PasswordMatches(h, c.password+"x") {
				t.Fatalf("hash %q matches another password", h)
			}
		})
	}
	if _, err := hashPasswordFrom(strings.NewReader("")); !errors.Is(err, errNoPassword) {
		t.Fatalf("empty stdin: %v, want errNoPassword", err)
	}
}
