//go:build linux && cgo

package podjoin

/*
#cgo CFLAGS: -Wall -O2
*/
import "C"

// Supported reports whether the constructor is in this binary.
const Supported = true
