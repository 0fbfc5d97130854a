package httpapi

import (
	"crypto/pbkdf2"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"hash"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// authenticate checks basic auth against the admins and returns the user.
// With no admins configured every request is let through as user "".
func (s *Server) authenticate(r *http.Request) (string, *apiError) {
	if len(s.admins) == 0 {
		return "", nil
	}
	client := clientOf(r)
	if wait, blocked := s.guard.blocked(client); blocked {
		e := errorf(http.StatusTooManyRequests, "too_many_requests", "too many failed logins from %s: retry in %s", client, wait.Round(time.Second))
		e.retryAfter = wait
		return "", e
	}
	user, pass, ok := r.BasicAuth()
	if !ok {
		return "", errorf(http.StatusUnauthorized, "unauthorized", "You are not a server admin.")
	}
	stored, known := s.admins[user]
	if !known || !s.guard.check(user, stored, pass) {
		s.guard.failed(client)
		return "", errorf(http.StatusUnauthorized, "unauthorized", "Name or password is incorrect.")
	}
	return user, nil
}

// PasswordMatches reports whether password matches an [admins] value:
// a plain password, or one of CouchDB's hashes —
// "-pbkdf2-<hex key>,<salt>,<iterations>" (PBKDF2-HMAC-SHA1),
// "-pbkdf2:sha256-<hex key>,<salt>,<iterations>" (PBKDF2-HMAC-SHA256, CouchDB
// 3.4+), or "-hashed-<hex sha1(password+salt)>,<salt>" (CouchDB 1.x).
// Comparisons take constant time.
func PasswordMatches(stored, password string) bool {
	switch {
	case strings.HasPrefix(stored, "-pbkdf2-"):
		return pbkdf2Matches(sha1.New, strings.TrimPrefix(stored, "-pbkdf2-"), password)
	case strings.HasPrefix(stored, "-pbkdf2:sha256-"):
		return pbkdf2Matches(sha256.New, strings.TrimPrefix(stored, "-pbkdf2:sha256-"), password)
	case strings.HasPrefix(stored, "-pbkdf2:sha-"):
		return pbkdf2Matches(sha1.New, strings.TrimPrefix(stored, "-pbkdf2:sha-"), password)
	case strings.HasPrefix(stored, "-hashed-"):
		key, salt, ok := strings.Cut(strings.TrimPrefix(stored, "-hashed-"), ",")
		want, err := hex.DecodeString(key)
		if !ok || err != nil {
			return false
		}
		got := sha1.Sum([]byte(password + salt))
		return subtle.ConstantTimeCompare(got[:], want) == 1
	}
	return subtle.ConstantTimeCompare([]byte(stored), []byte(password)) == 1
}

func pbkdf2Matches(h func() hash.Hash, spec, password string) bool {
	parts := strings.Split(spec, ",")
	if len(parts) != 3 {
		return false
	}
	want, err := hex.DecodeString(parts[0])
	iter, ierr := strconv.Atoi(parts[2])
	if err != nil || ierr != nil || iter < 1 || len(want) == 0 {
		return false
	}
	got, err := pbkdf2.Key(h, password, []byte(parts[1]), iter, len(want))
	return err == nil && subtle.ConstantTimeCompare(got, want) == 1
}
