package checkpoint

// SetCrash sets the crash hook (tests only).
func SetCrash(f func(step string)) { crash = f }

// SetParallel sets how many workers Create, Restore, Export and Import
// run, and returns a function that puts the old value back (tests only).
func SetParallel(n int) (undo func()) {
	old := parallel
	parallel = func() int { return n }
	return func() { parallel = old }
}

// Pol is the chunker's polynomial, for tests that cut chunks themselves.
const Pol = pol

// Archive limits and record kinds (docs/archive.md), for tests that build
// hostile archives.
const (
	MaxSnapshot = maxSnapshot
	MaxFrame    = maxFrame
	RecSnapshot = recSnapshot
	RecChunk    = recChunk
	RecEnd      = recEnd
)
