package daytona

// SetPerCallSessions makes a's executors use one toolbox session per call,
// deleted on the call's path: what the session pool replaced, kept for the
// benchmark's before/after and the tests that compare.
func SetPerCallSessions(a *Adapter, on bool) { a.perCallSessions = on }
