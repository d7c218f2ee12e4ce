//go:build !(linux && cgo)

package podjoin

// Supported reports whether the constructor is in this binary: not
// without cgo.
const Supported = false
