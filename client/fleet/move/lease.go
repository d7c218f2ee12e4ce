package move

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/agentrunner/runner/adapter"
)

// Lease is a mover's claim on one sandbox name: the object
// PREFIX/leases/NAME, made only if absent (a conditional PUT with
// If-None-Match: *), so of two movers of the same sandbox exactly one
// holds it, whichever control plane process or host each runs in. A lease
// past Expires (its mover died) is taken over only if unchanged since it
// was read (If-Match on its ETag).
type Lease struct {
	Sandbox string    `json:"sandbox"`
	Holder  string    `json:"holder"` // who moves it (Mover.Holder)
	From    string    `json:"from"`   // runner it leaves
	To      string    `json:"to"`     // runner it goes to
	Taken   time.Time `json:"taken"`
	Expires time.Time `json:"expires"` // by the holder's clock
	etag    string
}

// ErrLeaseHeld is matched (errors.Is) by a *LeaseHeldError.
var ErrLeaseHeld = errors.New("sandbox is being moved by another mover")

// LeaseHeldError is returned when another mover holds the sandbox's
// lease. It is a conflict: errors.Is matches ErrLeaseHeld and
// adapter.ErrInvalid (runner answers conflicts as 409 invalid).
type LeaseHeldError struct{ Held Lease }

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("invalid: sandbox %s is being moved by %s (from %s to %s, lease until %s)", e.Held.Sandbox, e.Held.Holder, e.Held.From, e.Held.To, e.Held.Expires.Format(time.RFC3339))
}

// Is reports whether target is ErrLeaseHeld or adapter.ErrInvalid.
func (e *LeaseHeldError) Is(target error) bool {
	return target == ErrLeaseHeld || target == adapter.ErrInvalid
}

// Acquire takes the lease l.Sandbox for l (Taken set now, Expires ttl
// later). *LeaseHeldError when another live lease holds it.
func (s *Store) Acquire(ctx context.Context, l Lease, ttl time.Duration) (Lease, error) {
	key := s.key("leases", l.Sandbox)
	for attempt := 0; ; attempt++ {
		l.Taken = time.Now().UTC()
		l.Expires = l.Taken.Add(ttl)
		var opts minio.PutObjectOptions
		opts.SetMatchETagExcept("*") // If-None-Match: * — create only
		info, err := s.putJSON(ctx, key, l, opts)
		if err == nil {
			l.etag = info.ETag
			return l, nil
		}
		if !errors.Is(err, errPrecondition) {
			return Lease{}, err
		}
		var cur Lease
		etag, err := s.getJSON(ctx, key, &cur)
		if errors.Is(err, errNoObject) && attempt < 3 {
			continue // released between the two calls
		}
		if err != nil {
			return Lease{}, err
		}
		if time.Now().Before(cur.Expires) {
			return Lease{}, &LeaseHeldError{Held: cur}
		}
		// Expired: its mover is gone. Take it over only as read, so of
		// two movers that both saw it expired one wins.
		opts = minio.PutObjectOptions{}
		opts.SetMatchETag(etag)
		info, err = s.putJSON(ctx, key, l, opts)
		if errors.Is(err, errPrecondition) {
			_, _ = s.getJSON(ctx, key, &cur)
			return Lease{}, &LeaseHeldError{Held: cur}
		}
		if err != nil {
			return Lease{}, err
		}
		l.etag = info.ETag
		return l, nil
	}
}

// ErrLeaseLost is returned by Release when the lease is no longer the
// one Acquire took (it expired and another mover took it over).
var ErrLeaseLost = errors.New("move lease was taken over")

// Release removes the lease if it is still l. S3 has no conditional
// delete every server honours, so the check and the delete are two
// calls: a takeover in between needs l to have expired meanwhile, which a
// TTL well above a move's duration rules out.
func (s *Store) Release(ctx context.Context, l Lease) error {
	key := s.key("leases", l.Sandbox)
	var cur Lease
	etag, err := s.getJSON(ctx, key, &cur)
	if errors.Is(err, errNoObject) {
		return fmt.Errorf("release lease of %s: %w", l.Sandbox, ErrLeaseLost)
	}
	if err != nil {
		return err
	}
	if etag != l.etag {
		return fmt.Errorf("release lease of %s (now %s's): %w", l.Sandbox, cur.Holder, ErrLeaseLost)
	}
	return s.remove(ctx, key)
}
