package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/couchrep/couchrep/internal/httpapi"
)

// runHashPassword is "couchrepd hash-password": it reads one password (the
// first line of stdin, without its line end) and prints its [admins] hash
// ("-pbkdf2-<key>,<salt>,<iterations>", CouchDB's), for a config file the
// node cannot rewrite itself (a read-only /etc under systemd). The password
// is never printed.
func runHashPassword(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
			_, _ = io.WriteString(stdout, hashPasswordUsage)
			return 0
		}
		// The argument may be the password itself: not repeated.
		fmt.Fprintf(stderr, "couchrepd hash-password: takes no argument: the password is read from stdin\n%s", hashPasswordUsage)
		return 2
	}
	h, err := hashPasswordFrom(stdin)
	if err != nil {
		fmt.Fprintf(stderr, "couchrepd hash-password: %v\n", err)
		return 2
	}
	fmt.Fprintln(stdout, h)
	return 0
}

const hashPasswordUsage = `Usage:
  couchrepd hash-password < FILE
  read -rs PW && printf '%s\n' "$PW" | couchrepd hash-password

Reads a password (the first line of stdin) and prints its [admins] hash, to
put in the config file in place of the plain password: name = -pbkdf2-...
`

// errNoPassword: stdin held no password.
var errNoPassword = errors.New("no password on stdin (the first line is the password)")

// hashPasswordFrom hashes the first line of r, its "\n" or "\r\n" removed
// (any other byte is part of the password).
func hashPasswordFrom(r io.Reader) (string, error) {
	line, err := bufio.NewReader(io.LimitReader(r, 64<<10)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("reading stdin: %w", err)
	}
	pw := strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
	if pw == "" {
		return "", errNoPassword
	}
	h, err := httpapi.HashPassword(pw)
	if err != nil {
		return "", fmt.Errorf("hashing: %w", err)
	}
	return h, nil
}
