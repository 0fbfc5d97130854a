package couch

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
)

// Sentinel errors callers branch on. An *HTTPError matches the one for its
// status (errors.Is), so callers never compare status codes themselves.
var (
	// ErrNotFound: 404 (missing database, document or _local document).
	ErrNotFound = errors.New("couch: not found")
	// ErrUnauthorized: 401, the credentials were missing or rejected.
	ErrUnauthorized = errors.New("couch: unauthorized")
	// ErrForbidden: 403, the user may not do this (also a validate_doc_update rejection).
	ErrForbidden = errors.New("couch: forbidden")
	// ErrConflict: 409, a document update conflict.
	ErrConflict = errors.New("couch: conflict")
	// ErrExists: 412 file_exists, the database already exists (Create).
	ErrExists = errors.New("couch: database already exists")
	// ErrMissingStub: 412 missing_stub, an attachment stub names an
	// attachment the target does not have; refetch the doc with its data.
	ErrMissingStub = errors.New("couch: missing attachment stub")
	// ErrTooLarge: 413, the request body exceeds the server's limit; split the batch.
	ErrTooLarge = errors.New("couch: request too large")
	// ErrRateLimited: 429 seen and the Limiter gave up (or none is set and
	// the retries ran out).
	ErrRateLimited = errors.New("couch: rate limited")
	// ErrBulkGetUnsupported: the endpoint has no _bulk_get (CouchDB < 2.0
	// answers 404/405/501); fall back to OpenRevs.
	ErrBulkGetUnsupported = errors.New("couch: _bulk_get not supported")
	// ErrBadResponse: the server's answer could not be decoded (malformed
	// JSON, a feed cut mid-row, an unexpected content type).
	ErrBadResponse = errors.New("couch: malformed response")
	// ErrInvalidEndpoint: ParseEndpoint rejected its input.
	ErrInvalidEndpoint = errors.New("couch: invalid endpoint")
	// ErrFeedStalled: a changes feed sent nothing (not even a heartbeat)
	// for longer than its idle limit; the connection is presumed dead.
	ErrFeedStalled = errors.New("couch: changes feed stalled")
)

// HTTPError is a non-success HTTP response. It never holds credentials: URL
// is redacted.
type HTTPError struct {
	Method string
	// URL is the request URL without credentials (query strings longer
	// than 200 bytes are shortened).
	URL    string
	Status int
	// ErrorName and Reason are CouchDB's {"error": ..., "reason": ...}; empty
	// when the body was not CouchDB JSON.
	ErrorName string
	Reason    string
}

// Error implements error: "couch: PUT http://h/db/ -> 412 file_exists: The database could not be created...".
func (e *HTTPError) Error() string {
	s := fmt.Sprintf("couch: %s %s -> %d", e.Method, e.URL, e.Status)
	switch {
	case e.ErrorName != "" && e.Reason != "":
		s += " " + e.ErrorName + ": " + e.Reason
	case e.ErrorName != "":
		s += " " + e.ErrorName
	case e.Reason != "":
		s += " " + e.Reason
	default:
		s += " " + http.StatusText(e.Status)
	}
	return s
}

// Is matches the sentinel errors by status (and CouchDB error name for 412).
func (e *HTTPError) Is(target error) bool {
	switch target {
	case ErrNotFound:
		return e.Status == http.StatusNotFound
	case ErrUnauthorized:
		return e.Status == http.StatusUnauthorized
	case ErrForbidden:
		return e.Status == http.StatusForbidden
	case ErrConflict:
		return e.Status == http.StatusConflict
	case ErrExists:
		return e.Status == http.StatusPreconditionFailed && e.ErrorName != "missing_stub"
	case ErrMissingStub:
		return e.Status == http.StatusPreconditionFailed && e.ErrorName == "missing_stub"
	case ErrTooLarge:
		return e.Status == http.StatusRequestEntityTooLarge
	case ErrRateLimited:
		return e.Status == http.StatusTooManyRequests
	}
	return false
}

// Retryable reports whether CouchDB's replicator would retry this response:
// 408, 429 and every 5xx.
func (e *HTTPError) Retryable() bool {
	return retryableStatus(e.Status) || e.Status == http.StatusTooManyRequests
}

func retryableStatus(code int) bool {
	return code == http.StatusRequestTimeout || code >= 500
}

// ErrCertificate: an endpoint's (or an https proxy's) TLS certificate did
// not verify: unknown authority, expired or not yet valid, issued for
// another host, or a chain longer than ssl_certificate_max_depth. Such a
// request is not retried: the job crashes and the scheduler's backoff
// decides when to try again.
var ErrCertificate = errors.New("couch: certificate verification failed")

// CertificateError is a certificate that did not verify, with a short
// reason ("unknown authority", "expired", "wrong host", "chain too long",
// "invalid"). It matches ErrCertificate.
type CertificateError struct {
	Reason string
	Err    error
}

// Error implements error.
func (e *CertificateError) Error() string {
	return "certificate verification failed (" + e.Reason + "): " + e.Err.Error()
}

// Unwrap returns the TLS or x509 error.
func (e *CertificateError) Unwrap() error { return e.Err }

// Is matches ErrCertificate.
func (e *CertificateError) Is(target error) bool { return target == ErrCertificate }

// AsCertificateError classifies a transport error; ok is false when err is
// not about a certificate.
func AsCertificateError(err error) (*CertificateError, bool) {
	var ce *CertificateError
	if errors.As(err, &ce) {
		return ce, true
	}
	var ua x509.UnknownAuthorityError
	if errors.As(err, &ua) {
		return &CertificateError{Reason: "unknown authority", Err: err}, true
	}
	var he x509.HostnameError
	if errors.As(err, &he) {
		return &CertificateError{Reason: "wrong host", Err: err}, true
	}
	var ci x509.CertificateInvalidError
	if errors.As(err, &ci) {
		reason := "invalid"
		switch ci.Reason {
		case x509.Expired:
			reason = "expired"
		case x509.TooManyIntermediates:
			reason = "chain too long"
		}
		return &CertificateError{Reason: reason, Err: err}, true
	}
	var cv *tls.CertificateVerificationError
	if errors.As(err, &cv) {
		return &CertificateError{Reason: "invalid", Err: err}, true
	}
	return nil, false
}
