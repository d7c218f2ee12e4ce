package daemon

import (
	"net"
	"os"
)

// sdNotify sends state (e.g. "READY=1") to systemd's notification socket
// when runnerd runs under a Type=notify unit. Without $NOTIFY_SOCKET it does
// nothing. See sd_notify(3); an abstract socket is written with a leading
// '@' in the variable.
func sdNotify(state string) error {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return nil
	}
	if addr[0] == '@' {
		addr = "\x00" + addr[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Write([]byte(state))
	return err
}
