package schedpolicy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// ErrInvalidPolicy is returned by Policy.Validate.
var ErrInvalidPolicy = errors.New("scheduler: invalid policy")

// Policy is the scheduler's configuration ([replicator] keys).
type Policy struct {
	// MaxJobs is the most jobs running on this node (max_jobs, 500).
	MaxJobs int
	// MaxChurn is the most jobs stopped per interval (max_churn, 20).
	MaxChurn int
	// Interval is the rescheduling period (interval, 60 s).
	Interval time.Duration
	// MinBackoff is the backoff after a first crash
	// (min_backoff_penalty_sec, 32 s); it doubles per consecutive crash.
	MinBackoff time.Duration
	// MaxBackoff caps the backoff (max_backoff_penalty_sec, 48 h).
	MaxBackoff time.Duration
	// HealthThreshold is how long a job must run without crashing for its
	// consecutive-crash count to start over (health_threshold, 120 s).
	HealthThreshold time.Duration
	// MaxHistory is the number of events kept per job (max_history, 20).
	MaxHistory int
	// StartupJitter bounds the random delay before a started job does any
	// work (startup_jitter, 5 s).
	StartupJitter time.Duration
	// MinRunTime keeps a continuous job from being rotated out before it
	// ran this long (min_run_time_sec of the FoundationDB-era job server).
	// Zero, the default, means CouchDB 3.x behaviour: no minimum.
	MinRunTime time.Duration
}

// DefaultPolicy returns CouchDB's defaults (3.x for the scheduler keys, the
// FoundationDB-era job server for the backoff keys).
func DefaultPolicy() Policy {
	return Policy{
		MaxJobs:         500,
		MaxChurn:        20,
		Interval:        60 * time.Second,
		MinBackoff:      32 * time.Second,
		MaxBackoff:      48 * time.Hour,
		HealthThreshold: 120 * time.Second,
		MaxHistory:      20,
		StartupJitter:   5 * time.Second,
	}
}

// Validate reports a policy the scheduler cannot run with, wrapping
// ErrInvalidPolicy.
func (p Policy) Validate() error {
	switch {
	case p.MaxJobs < 0:
		return fmt.Errorf("%w: max_jobs %d < 0", ErrInvalidPolicy, p.MaxJobs)
	case p.MaxChurn <= 0:
		return fmt.Errorf("%w: max_churn %d <= 0", ErrInvalidPolicy, p.MaxChurn)
	case p.Interval <= 0:
		return fmt.Errorf("%w: interval %v <= 0", ErrInvalidPolicy, p.Interval)
	case p.MinBackoff <= 0:
		return fmt.Errorf("%w: min backoff %v <= 0", ErrInvalidPolicy, p.MinBackoff)
	case p.MaxBackoff < p.MinBackoff:
		return fmt.Errorf("%w: max backoff %v < min backoff %v", ErrInvalidPolicy, p.MaxBackoff, p.MinBackoff)
	case p.HealthThreshold <= 0:
		return fmt.Errorf("%w: health_threshold %v <= 0", ErrInvalidPolicy, p.HealthThreshold)
	case p.MaxHistory <= 0:
		return fmt.Errorf("%w: max_history %d <= 0", ErrInvalidPolicy, p.MaxHistory)
	case p.StartupJitter < 0:
		return fmt.Errorf("%w: startup_jitter %v < 0", ErrInvalidPolicy, p.StartupJitter)
	case p.MinRunTime < 0:
		return fmt.Errorf("%w: min run time %v < 0", ErrInvalidPolicy, p.MinRunTime)
	}
	return nil
}

// Backoff is how long a job waits after its n-th consecutive crash:
// min(MinBackoff·2^(n-1), MaxBackoff), i.e. the issue's
// min(min_backoff·2^consecutive_errors, max_backoff) with consecutive_errors
// counting the crashes before this one (CouchDB's backoff_micros(N) uses
// 2^(N-1) too). n <= 0 means no backoff.
func (p Policy) Backoff(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	d := p.MinBackoff
	for i := 1; i < n; i++ {
		if d >= p.MaxBackoff/2 {
			return p.MaxBackoff
		}
		d *= 2
	}
	return min(d, p.MaxBackoff)
}

// RunQuantum is how long a continuous job can expect to run before
// rotation stops it when jobs are pending: Interval × ⌈MaxJobs/MaxChurn⌉
// (25 minutes with the defaults). It is the share.Params.Quantum to use, so
// that the fair-share time reserved when a job is enqueued matches what it
// will use.
func (p Policy) RunQuantum() time.Duration {
	if p.MaxChurn <= 0 {
		return p.Interval
	}
	return p.Interval * time.Duration(max(1, (p.MaxJobs+p.MaxChurn-1)/p.MaxChurn))
}

// StartupDelay is the random delay before a started job does any work,
// uniform in [1 ms, StartupJitter] as CouchDB's rand:uniform(max(1, J)) ms.
// A nil rnd uses the global source.
func (p Policy) StartupDelay(rnd *rand.Rand) time.Duration {
	ms := max(int64(p.StartupJitter/time.Millisecond), 1)
	var n int64
	if rnd == nil {
		n = rand.Int64N(ms)
	} else {
		n = rnd.Int64N(ms)
	}
	return time.Duration(n+1) * time.Millisecond
}
