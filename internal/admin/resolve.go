package admin

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/repjob"
)

var (
	// ErrNoSuchJob is what FindJob returns (wrapped) when nothing matches.
	ErrNoSuchJob = errors.New("no such job")
	// ErrAmbiguousJob is what FindJob returns (wrapped) for a prefix that
	// matches several jobs; the error names them.
	ErrAmbiguousJob = errors.New("ambiguous job id")
)

// MinPrefix is the shortest prefix FindJob resolves: shorter ones would
// match by chance ("h" of every "http://…" job id).
const MinPrefix = 4

// shownMatches is how many jobs an ambiguous prefix's error names.
const shownMatches = 5

// JobStore is what FindJob reads.
type JobStore interface {
	Get(ctx context.Context, jobID string) (*repjob.Record, error)
	FindByRepID(ctx context.Context, repID string) (*repjob.Record, error)
	Each(ctx context.Context, f repjob.Filter, fn func(*repjob.Record) error) error
}

var _ JobStore = (*repjob.Store)(nil)

// ActorName is the child name of the actor running job jobID under
// jobs_sup, as `couchrepctl tree` shows it: "job-" and 16 hex digits of the
// SHA-1 of the job id (jobrunner.Name; TestActorNameIsJobrunners proves
// they agree).
func ActorName(jobID string) string {
	sum := sha1.Sum([]byte(jobID))
	return "job-" + hex.EncodeToString(sum[:8])
}

// idForms are the ways id may be written that name the same job: as given,
// with its credentials redacted, and without them (a persistent job's id
// holds its server's URL, "http://host:5984|_replicator|doc"; a user
// builds it from an exported $SOURCE, password and all).
func idForms(id string) []string {
	forms := []string{id}
	add := func(s string) {
		for _, f := range forms {
			if f == s {
				return
			}
		}
		forms = append(forms, s)
	}
	if server, rest, ok := strings.Cut(id, "|"); ok {
		add(redactID(id))
		add(strings.TrimRight(redact.URL(server), "/") + "|" + rest)
		// The doc processor keys a server by its URL without userinfo
		// (its credentials travel apart).
		plain := strings.TrimRight(redact.StripUserinfo(server), "/")
		add(plain + "|" + rest)
	}
	add(redact.URL(id))
	add(redact.Text(id))
	return forms
}

// FindJob finds the job id names, as git finds a commit: its job id or
// replication id (with or without the "+continuous" extension), the status
// page's short form of it (repjob.ShortRepID: "0123456789ab+continuous"), the
// name of the actor running it ("job-…"), or a unique prefix (at least
// MinPrefix characters) of its job id or replication id. Ids that hold
// credentials are matched after redaction. A prefix of several jobs gives
// an error wrapping ErrAmbiguousJob naming them; nothing found, one
// wrapping ErrNoSuchJob. Errors never hold the credentials of id (a store
// error is wrapped as is: the admin endpoint redacts every error it sends).
func FindJob(ctx context.Context, s JobStore, id string) (*repjob.Record, error) {
	id = strings.TrimSpace(id)
	shown := redactID(id)
	if id == "" {
		return nil, fmt.Errorf("%w: no job id given", ErrNoSuchJob)
	}
	forms := idForms(id)
	for _, f := range forms {
		rec, err := s.Get(ctx, f)
		if err == nil {
			return rec, nil
		}
		if !errors.Is(err, repjob.ErrNotFound) {
			return nil, fmt.Errorf("find job %q: %w", shown, err)
		}
		rec, err = s.FindByRepID(ctx, f)
		if err == nil {
			return rec, nil
		}
		if !errors.Is(err, repjob.ErrNotFound) {
			return nil, fmt.Errorf("find job %q: %w", shown, err)
		}
	}
	// An actor name or a prefix: one pass over the jobs.
	actor := strings.HasPrefix(id, "job-")
	prefix := len(id) >= MinPrefix
	if !actor && !prefix {
		return nil, fmt.Errorf("%w: %q (a job id prefix needs at least %d characters)", ErrNoSuchJob, shown, MinPrefix)
	}
	var matches []*repjob.Record
	err := s.Each(ctx, repjob.Filter{}, func(r *repjob.Record) error {
		if actor && ActorName(r.GetJobId()) == id {
			matches = append(matches[:0], r)
			return errStop
		}
		if prefix {
			for _, f := range forms {
				if strings.HasPrefix(r.GetJobId(), f) || repIDHasPrefix(r.GetRepId(), f) {
					matches = append(matches, r)
					break
				}
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return nil, fmt.Errorf("find job %q: %w", shown, err)
	}
	if len(matches) > 1 && !strings.Contains(id, "+") {
		if r := withoutExtension(matches); r != nil {
			return r, nil
		}
	}
	switch len(matches) {
	case 0:
		return nil, fmt.Errorf("%w: %q", ErrNoSuchJob, shown)
	case 1:
		return matches[0], nil
	}
	names := make([]string, 0, len(matches))
	for _, m := range matches {
		names = append(names, ShownID(m))
	}
	sort.Strings(names)
	more := ""
	if len(names) > shownMatches {
		more = fmt.Sprintf(" and %d more", len(names)-shownMatches)
		names = names[:shownMatches]
	}
	return nil, fmt.Errorf("%w: %q matches %d jobs: %s%s", ErrAmbiguousJob, shown, len(matches), strings.Join(names, ", "), more)
}

var errStop = errors.New("stop")

// repIDHasPrefix reports whether replication id repID starts with prefix,
// where a prefix with an extension ("0123456789ab+continuous", the status
// page's short form, repjob.ShortRepID) names a base starting with its part
// before "+" and exactly that extension.
func repIDHasPrefix(repID, prefix string) bool {
	if repID == "" {
		return false
	}
	pb, pext, ok := strings.Cut(prefix, "+")
	if !ok {
		return strings.HasPrefix(repID, prefix)
	}
	base, ext, _ := strings.Cut(repID, "+")
	return ext == pext && strings.HasPrefix(base, pb)
}

// withoutExtension is, of the jobs a prefix without "+" matched, the one
// whose replication id has no extension when all the others are the same
// replication with one ("…+continuous", "…+create_target"): the one-shot
// replication of a pair, as the status page shows it (repjob.ShortRepID).
// Otherwise nil.
func withoutExtension(matches []*repjob.Record) *repjob.Record {
	var plain *repjob.Record
	for _, m := range matches {
		if m.GetRepId() != "" && !strings.Contains(m.GetRepId(), "+") {
			if plain != nil {
				return nil
			}
			plain = m
		}
	}
	if plain == nil {
		return nil
	}
	for _, m := range matches {
		if base, _, _ := strings.Cut(m.GetRepId(), "+"); m != plain && base != plain.GetRepId() {
			return nil
		}
	}
	return plain
}

// ShownID is the id couchrepctl shows for a job: its job id, redacted.
func ShownID(r *repjob.Record) string { return redactID(r.GetJobId()) }

// redactID is a job id (or what a user gave as one) without credentials:
// a persistent job's "server|db|doc" with the server URL redacted.
func redactID(id string) string {
	if server, rest, ok := strings.Cut(id, "|"); ok {
		return redact.URL(server) + "|" + redact.Text(rest)
	}
	return redact.Text(redact.URL(id))
}
