package sandboxes

import (
	"context"
	"errors"
	"regexp"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/wire"
)

// Looking sandboxes up: names, incarnations, the registry answers mapped
// into the taxonomy (not_found only when the registry said so).

// RegistryErr scopes a registry error about sandbox name.
func (s *Manager) RegistryErr(err error, name string) error {
	var ae *apierr.Error
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, registry.ErrNotFound):
		return apierr.NotFound("sandbox %q does not exist", name)
	case apierr.IsNoSpace(err): // diskfull.go
		return apierr.NoSpace("write registry", err)
	}
	return apierr.Unavailable("registry: %v", err)
}

type incarnationKey struct{}

// WithIncarnation scopes ctx to incarnation inc of the sandbox a request
// names (query "incarnation"): the manager's methods then refuse, with
// not_found, a sandbox whose incarnation is another (CheckIncarnation).
func WithIncarnation(ctx context.Context, inc string) context.Context {
	return context.WithValue(ctx, incarnationKey{}, inc)
}

// CheckIncarnation returns not_found when the request named an incarnation
// (see scoped) other than sb's.
func CheckIncarnation(ctx context.Context, sb registry.Sandbox) error {
	return IncarnationIs(ctx, sb.Name, sb.Incarnation)
}

// IncarnationIs returns not_found when the request named an incarnation
// other than incarnation, that of sandbox name; nil when it named none.
func IncarnationIs(ctx context.Context, name, incarnation string) error {
	want, _ := ctx.Value(incarnationKey{}).(string)
	if want == "" || want == incarnation {
		return nil
	}
	return apierr.NotFound("sandbox %q: incarnation %s does not exist (the live one is %s)", name, want, incarnation)
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidName checks a sandbox name: a DNS label.
func ValidName(name string) error {
	if !dnsLabel.MatchString(name) {
		return apierr.Invalid("sandbox name %q is not a DNS label (1-63 of [a-z0-9-], no leading or trailing '-')", name)
	}
	return nil
}

// sandbox looks up the sandbox named in the path: 400 for a bad name, 404
// not_found only when the registry says it does not exist.
func (s *Manager) Get(name string) (registry.Sandbox, error) {
	if err := ValidName(name); err != nil {
		return registry.Sandbox{}, err
	}
	sb, err := s.reg.GetSandbox(name)
	if errors.Is(err, registry.ErrNotFound) {
		return sb, apierr.NotFound("sandbox %q does not exist", name)
	}
	if err != nil {
		return sb, apierr.Unavailable("read registry: %v", err)
	}
	return sb, nil
}

// Scoped is Get(name), refused with not_found when the request
// named an incarnation that is not the live sandbox's (CheckIncarnation).
func (s *Manager) Scoped(ctx context.Context, name string) (registry.Sandbox, error) {
	sb, err := s.Get(name)
	if err == nil {
		err = CheckIncarnation(ctx, sb)
	}
	return sb, err
}

// Each calls fn with every sandbox of the registry, a page at a
// time, in name order. It stops at the first failed page (the error) or
// when ctx ends (ctx's error), checked before each sandbox: never a
// silently short walk.
func (s *Manager) Each(ctx context.Context, fn func(registry.Sandbox)) error {
	after := ""
	for {
		sbs, more, err := s.reg.ListSandboxes(after, wire.MaxListLimit)
		if err != nil {
			return err
		}
		for _, sb := range sbs {
			if err := ctx.Err(); err != nil {
				return err
			}
			fn(sb)
		}
		if !more || len(sbs) == 0 {
			return nil
		}
		after = sbs[len(sbs)-1].Name
	}
}

// ReplenishReserve sets the registry's reserve aside again after
// something freed space (a destroy, a deleted session); a failure is only
// logged: the next release finds no reserve and says so.
func (s *Manager) ReplenishReserve() {
	if _, err := s.reg.ReplenishReserve(); err != nil {
		s.log.Warn("registry reserve not set aside", "err", err)
	}
}
