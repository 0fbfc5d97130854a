package httpapi

import (
	"context"
	"crypto/pbkdf2"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"hash"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/couchrep/couchrep/internal/replicate"
)

// UsersOptions configure who may use the API beyond [admins]: CouchDB
// users, checked with the auth server's GET /_session.
type UsersOptions struct {
	// AuthServer is the CouchDB server whose users are accepted ([couchrep]
	// auth_server); empty accepts only Options.Admins (and with no admins
	// either, everyone: an admin party).
	AuthServer string
	// Client asks the auth server; nil means a client with
	// DefaultAuthServerTimeout.
	Client *http.Client
	// CacheTTL is how long an answer of the auth server is remembered;
	// zero asks it every time.
	CacheTTL time.Duration
	// SessionSecret returns the secret session cookies are signed with,
	// the same on every node (cluster.SessionSecret); nil means one of
	// this process.
	SessionSecret func(context.Context) ([]byte, error)
	// SessionTimeout is how long a session cookie is valid; zero means
	// DefaultSessionTimeout.
	SessionTimeout time.Duration
}

// users is the server's view of who may do what.
type users struct {
	adminParty bool
	auth       *authServer // nil: no auth server
	authErr    error       // the auth server's URL is not usable
	cache      *authCache
	sessions   *sessions
}

func newUsers(o UsersOptions, admins map[string]string) *users {
	u := &users{
		adminParty: len(admins) == 0 && o.AuthServer == "",
		cache:      newAuthCache(o.CacheTTL, authCacheSize),
		sessions:   newSessions(o.SessionTimeout, o.SessionSecret),
	}
	if o.AuthServer != "" {
		u.auth, u.authErr = newAuthServer(o.AuthServer, o.Client)
	}
	return u
}

// authenticate finds who the request is (identify) and whether that user
// may use the route, answering as CouchDB 3.4 does where it refuses.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, route string) (UserCtx, *apiError) {
	u, aerr := s.identify(w, r)
	if aerr != nil {
		return UserCtx{}, aerr
	}
	return u, authorize(u, route)
}

// authorize is chttpd_auth_request's decision for couchrep's routes:
//   - /_replicate: any authenticated user ("You are not an authenticated
//     user" otherwise);
//   - /_active_tasks: a server admin; its handler throws unauthorized, so a
//     user who is not an admin gets 401 too;
//   - /_node/_local/_prometheus (and /metrics): the _admin or _metrics role;
//   - everything else (/_scheduler/*, the status page): a server admin. A
//     refusal of a logged-in user is 403 forbidden, of an anonymous one 401
//     unauthorized, with CouchDB's reason.
func authorize(u UserCtx, route string) *apiError {
	refuse := func(reason string) *apiError {
		if u.Name == "" {
			return errorf(http.StatusUnauthorized, "unauthorized", "%s", reason)
		}
		return errorf(http.StatusForbidden, "forbidden", "%s", reason)
	}
	switch {
	case u.IsAdmin():
		return nil
	case route == "replicate":
		if u.Name == "" {
			return errorf(http.StatusUnauthorized, "unauthorized", "You are not an authenticated user")
		}
		return nil
	case route == "active_tasks":
		return errorf(http.StatusUnauthorized, "unauthorized", "You are not a server admin.")
	case route == "metrics":
		if u.has(RoleMetrics) {
			return nil
		}
		return refuse("You are not a server admin or read-only metrics user")
	}
	return refuse("You are not a server admin.")
}

// mayControl is couch_replicator:check_authorization: a job's owner and
// server admins may cancel it; anyone else gets 401 unauthorized "You are
// not a server admin." (thrown in the handler, so also for a logged-in
// user).
func mayControl(u UserCtx, job *Job) *apiError {
	if u.IsAdmin() || (u.Name != "" && u.Name == job.User) {
		return nil
	}
	return errorf(http.StatusUnauthorized, "unauthorized", "You are not a server admin.")
}

// sameReplication finds, for a cancel by body that matches no job of the
// caller (job ids include the user), a transient job of another user with
// the same replication id: CouchDB knows a replication by that id only, so
// the caller then gets what mayControl says (401 unless an admin, who
// cancels it) rather than 404. notFound is returned when there is none.
func (s *Server) sameReplication(ctx context.Context, req replicate.ReplicateRequest, notFound error) (*Job, error) {
	base, ext, err := replicate.ID(req.Params, s.uuid)
	if err != nil {
		return nil, notFound // a named filter: the id needs the source
	}
	job, err := s.store.FindByRepID(ctx, base+ext)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, notFound
	case err != nil:
		return nil, err
	case !job.Transient:
		return nil, notFound
	}
	return job, nil
}

// identify finds who the request is, as CouchDB's handlers in their order:
// an AuthSession cookie (couchrep's own, or CouchDB's that the auth server
// accepts), then Basic credentials ([admins], then the auth server). A
// cookie that is expired or not valid is ignored (the request goes on as
// anonymous or with its Basic credentials); wrong Basic credentials are a
// 401 and count against the client's failed-login limit. In an admin party
// everyone is a server admin.
func (s *Server) identify(w http.ResponseWriter, r *http.Request) (UserCtx, *apiError) {
	if s.users.adminParty {
		return UserCtx{Roles: []string{RoleAdmin}}, nil
	}
	client := clientOf(r)
	if aerr := s.blocked(client); aerr != nil {
		return UserCtx{}, aerr
	}
	ctx := r.Context()
	if c, err := r.Cookie(sessionCookie); err == nil && c.Value != "" {
		if ours(c.Value) {
			u, issued, err := s.users.sessions.verify(ctx, c.Value)
			switch {
			case err == nil:
				if s.users.sessions.stale(issued) {
					if v, err := s.users.sessions.sign(ctx, u, s.users.sessions.now()); err == nil {
						setCookie(w, s.users.sessions.cookie(r, v))
					}
				}
				return u, nil
			case !errors.Is(err, ErrBadCookie) && !errors.Is(err, ErrCookieExpired):
				s.log.Error().Err(err).Msg("http api: cannot read the session secret")
				return UserCtx{}, errorf(http.StatusServiceUnavailable, "service_unavailable", "the job store is unavailable: cannot read the session secret")
			}
		} else if s.users.auth != nil {
			// A cookie the auth server does not know is remembered as
			// such (an anonymous entry), so that a stale cookie a client
			// keeps sending costs one question per TTL, not one per request.
			key := s.users.cache.credKey("cookie", c.Value)
			u, known := s.users.cache.get(key)
			if !known {
				var err error
				u, err = s.users.auth.cookie(ctx, c.Value)
				switch {
				case err == nil:
					u.handler = "cookie"
				case errors.Is(err, ErrBadCredentials):
					u = UserCtx{}
				default:
					return UserCtx{}, s.authServerDown(err)
				}
				s.users.cache.put(key, u)
			}
			if u.Name != "" {
				return u, nil
			}
		}
	}
	if name, pass, ok := r.BasicAuth(); ok {
		u, aerr := s.checkPassword(ctx, client, name, pass)
		u.handler = "default"
		return u, aerr
	}
	return UserCtx{}, nil
}

// blocked is the failed-login limit: 429 while client must wait.
func (s *Server) blocked(client string) *apiError {
	if wait, blocked := s.guard.blocked(client); blocked {
		e := errorf(http.StatusTooManyRequests, "too_many_requests", "too many failed logins from %s: retry in %s", client, wait.Round(time.Second))
		e.retryAfter = wait
		return e
	}
	return nil
}

// checkPassword checks a name and password: against [admins] for a name
// there (a server admin), else with the auth server (whose answer is
// cached). A wrong one counts against client's failed-login limit.
func (s *Server) checkPassword(ctx context.Context, client, name, password string) (UserCtx, *apiError) {
	wrong := func() (UserCtx, *apiError) {
		s.guard.failed(client)
		return UserCtx{}, errorf(http.StatusUnauthorized, "unauthorized", "Name or password is incorrect.")
	}
	if stored, known := s.admins[name]; known {
		if !s.guard.check(name, stored, password) {
			return wrong()
		}
		return UserCtx{Name: name, Roles: []string{RoleAdmin}}, nil
	}
	if s.users.auth == nil {
		if s.users.authErr != nil {
			return UserCtx{}, s.authServerDown(s.users.authErr)
		}
		return wrong()
	}
	key := s.users.cache.credKey("basic", name, password)
	if u, ok := s.users.cache.get(key); ok {
		return u, nil
	}
	u, err := s.users.auth.basic(ctx, name, password)
	switch {
	case errors.Is(err, ErrBadCredentials):
		return wrong()
	case err != nil:
		return UserCtx{}, s.authServerDown(err)
	}
	s.users.cache.put(key, u)
	return u, nil
}

// authServerDown is the answer when the auth server cannot say who a user
// is: 503, so that the client retries (its credentials were not refused).
func (s *Server) authServerDown(err error) *apiError {
	s.log.Warn().Err(err).Msg("http api: cannot ask the auth server who a user is")
	return errorf(http.StatusServiceUnavailable, "service_unavailable", "cannot check the credentials: the auth server is unavailable")
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
