// Command probe is the network probe the daemon's network-policy tests run
// inside a sandbox (standard library only). It exits 0 when the probe
// succeeds and 1 when it fails, printing what happened.
//
//	probe get IP          HTTP GET http://IP/ (port 80), prints the body
//	probe dns SERVER NAME A query for NAME to SERVER:53 ("gw": the default gateway)
//	probe getname NAME    resolve NAME through the gateway's resolver, then GET it
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	switch {
	case len(args) == 2 && args[0] == "get":
		return get(args[1])
	case len(args) == 3 && args[0] == "dns":
		ips, err := lookup(args[1], args[2])
		if err != nil {
			return err
		}
		fmt.Println(ips)
		return nil
	case len(args) == 2 && args[0] == "getname":
		ips, err := lookup("gw", args[1])
		if err != nil {
			return err
		}
		return get(ips[0])
	}
	return errors.New("usage: probe get IP | dns SERVER NAME | getname NAME")
}

func get(ip string) error {
	c, err := net.DialTimeout("tcp4", net.JoinHostPort(ip, "80"), 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	fmt.Print(string(b))
	return err
}

// gateway reads the default route's gateway from /proc/net/route.
func gateway() (string, error) {
	raw, err := os.ReadFile("/proc/net/route")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(raw), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 2 && f[1] == "00000000" {
			b, err := hex.DecodeString(f[2])
			if err != nil || len(b) != 4 {
				return "", fmt.Errorf("gateway %q", f[2])
			}
			v := binary.LittleEndian.Uint32(b)
			return net.IPv4(byte(v>>24), byte(v>>16), byte(v>>8), byte(v)).String(), nil
		}
	}
	return "", errors.New("no default route")
}

func lookup(server, name string) ([]string, error) {
	if server == "gw" {
		gw, err := gateway()
		if err != nil {
			return nil, err
		}
		server = gw
	}
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp4", net.JoinHostPort(server, "53"))
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	ips, err := r.LookupHost(ctx, name)
	if err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return nil, errors.New("no address")
	}
	return ips, nil
}
