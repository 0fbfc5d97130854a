package httpapi

import (
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// PBKDF2Iterations is the iteration count of the hashes HashPassword makes.
// A successful login is remembered (as a SHA-256 of the password), so only
// the first request of a user, and wrong passwords, pay for it.
const PBKDF2Iterations = 100000

// HashPassword returns CouchDB's "-pbkdf2-<derived key>,<salt>,<iterations>"
// hash of password (PBKDF2-HMAC-SHA1, a 20-byte key, a random 16-byte salt
// in hex), the form CouchDB writes into [admins] when it starts.
func HashPassword(password string) (string, error) {
	var salt [16]byte
	if _, err := rand.Read(salt[:]); err != nil {
		return "", err
	}
	s := hex.EncodeToString(salt[:])
	key, err := pbkdf2.Key(sha1.New, password, []byte(s), PBKDF2Iterations, sha1.Size)
	if err != nil {
		return "", err
	}
	return "-pbkdf2-" + hex.EncodeToString(key) + "," + s + "," + strconv.Itoa(PBKDF2Iterations), nil
}

// Defaults of the failed-login limiter.
const (
	// DefaultAuthFailureBurst is how many failed logins a client may make
	// in a row before it must wait.
	DefaultAuthFailureBurst = 10
	// DefaultAuthFailureInterval is how often one more attempt is allowed
	// after that (10 a minute).
	DefaultAuthFailureInterval = 6 * time.Second
	// maxAuthClients bounds the clients the limiter remembers.
	maxAuthClients = 10000
)

// authGuard remembers good logins (so that a PBKDF2 hash is computed once
// per user, not per request) and rate-limits failed ones per client
// address, as a leaky bucket: each failure adds one, one leaks out every
// interval; a client whose bucket is full gets 429 without its password
// being checked.
type authGuard struct {
	burst    float64
	interval time.Duration
	now      func() time.Time

	mu      sync.Mutex
	good    map[string][32]byte // user -> sha256(password) of a verified login
	clients map[string]*bucket
}

type bucket struct {
	level float64
	at    time.Time
}

func newAuthGuard(burst int, interval time.Duration) *authGuard {
	if burst <= 0 {
		burst = DefaultAuthFailureBurst
	}
	if interval <= 0 {
		interval = DefaultAuthFailureInterval
	}
	return &authGuard{burst: float64(burst), interval: interval, now: time.Now,
		good: map[string][32]byte{}, clients: map[string]*bucket{}}
}

// clientOf is the address failures are counted against.
func clientOf(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// level returns the client's bucket drained to now (nil when empty).
func (g *authGuard) level(client string, now time.Time) *bucket {
	b := g.clients[client]
	if b == nil {
		return nil
	}
	b.level = math.Max(0, b.level-float64(now.Sub(b.at))/float64(g.interval))
	b.at = now
	if b.level == 0 {
		delete(g.clients, client)
		return nil
	}
	return b
}

// blocked reports whether client must wait, and how long.
func (g *authGuard) blocked(client string) (time.Duration, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	b := g.level(client, now)
	if b == nil || b.level+1 <= g.burst {
		return 0, false
	}
	return time.Duration((b.level + 1 - g.burst) * float64(g.interval)), true
}

// failed records a failed login of client.
func (g *authGuard) failed(client string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	b := g.level(client, now)
	if b == nil {
		if len(g.clients) >= maxAuthClients {
			for c := range g.clients { // forget the drained ones, then any
				if g.level(c, now) == nil || len(g.clients) >= maxAuthClients {
					delete(g.clients, c)
				}
				if len(g.clients) < maxAuthClients/2 {
					break
				}
			}
		}
		b = &bucket{at: now}
		g.clients[client] = b
	}
	b.level++
}

// check verifies a login against the stored [admins] value, remembering
// a good one.
func (g *authGuard) check(user, stored, password string) bool {
	sum := sha256.Sum256([]byte(password))
	g.mu.Lock()
	known, ok := g.good[user]
	g.mu.Unlock()
	if ok && subtle.ConstantTimeCompare(known[:], sum[:]) == 1 {
		return true
	}
	if !PasswordMatches(stored, password) {
		return false
	}
	g.mu.Lock()
	g.good[user] = sum
	g.mu.Unlock()
	return true
}
