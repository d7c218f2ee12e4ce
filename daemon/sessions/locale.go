package sessions

import (
	"os"
	"sync"
)

// defaultLang is the LANG a command gets when its request sets none:
// C.UTF-8 where the host has that locale (glibc reads it from
// /usr/lib/locale/C.utf8, Debian's and Fedora's spelling, or C.UTF-8),
// so that a UTF-8 file name or message is not mangled into '?' by the C
// locale; "" (LANG unset, the C locale) where it has not, since a LANG
// naming a missing locale makes every program warn. Read once: the
// host's locales do not come and go under a running daemon.
var defaultLang = sync.OnceValue(func() string {
	for _, dir := range []string{"/usr/lib/locale/C.utf8", "/usr/lib/locale/C.UTF-8"} {
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			return "C.UTF-8"
		}
	}
	return ""
})
