// Command dnsflood is a hostile command for runnerd's tests
// (hostile_dns_test.go). Run inside a sandbox, it attacks the sandbox's
// DNS resolver, the nameserver of /etc/resolv.conf. Standard library
// only, built static.
//
//	dnsflood udp SECONDS QPS SUFFIX  send A queries for fresh names under
//	                                 SUFFIX, QPS a second, for SECONDS;
//	                                 prints "sent N answered M"
//	dnsflood tcp N SECONDS           open N TCP connections to the resolver
//	                                 (raising its descriptor limit), print
//	                                 "open K failed F", hold them until
//	                                 SECONDS have passed
package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: dnsflood udp SECONDS QPS SUFFIX | tcp N SECONDS")
	}
	ns, err := nameserver()
	if err != nil {
		fail(err.Error())
	}
	switch os.Args[1] {
	case "udp":
		if len(os.Args) != 5 {
			fail("usage: dnsflood udp SECONDS QPS SUFFIX")
		}
		floodUDP(ns, seconds(os.Args[2]), atoi(os.Args[3]), os.Args[4])
	case "tcp":
		if len(os.Args) != 4 {
			fail("usage: dnsflood tcp N SECONDS")
		}
		holdTCP(ns, atoi(os.Args[2]), seconds(os.Args[3]))
	default:
		fail("unknown mode " + os.Args[1])
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "dnsflood:", msg)
	os.Exit(2)
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		fail("not a positive number: " + s)
	}
	return n
}

func seconds(s string) time.Duration { return time.Duration(atoi(s)) * time.Second }

// nameserver is the first nameserver of /etc/resolv.conf, port 53.
func nameserver() (string, error) {
	f, err := os.Open("/etc/resolv.conf")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) == 2 && fs[0] == "nameserver" {
			return net.JoinHostPort(fs[1], "53"), nil
		}
	}
	return "", fmt.Errorf("no nameserver in /etc/resolv.conf")
}

// query is a DNS query for name, type A, recursion desired.
func query(id uint16, name string) []byte {
	b := binary.BigEndian.AppendUint16(nil, id)
	b = append(b, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0)
	for _, l := range strings.Split(name, ".") {
		b = append(b, byte(len(l)))
		b = append(b, l...)
	}
	return append(b, 0, 0, 1, 0, 1)
}

// floodUDP sends from 4 sockets, paced to qps in all, and counts the
// answers it reads back.
func floodUDP(ns string, d time.Duration, qps int, suffix string) {
	const senders = 4
	var sent, answered atomic.Int64
	end := time.Now().Add(d)
	run := fmt.Sprintf("%08x", rand.Uint32())
	var wg sync.WaitGroup
	for s := range senders {
		c, err := net.Dial("udp4", ns)
		if err != nil {
			fail(err.Error())
		}
		defer c.Close()
		wg.Add(2)
		go func() {
			defer wg.Done()
			buf := make([]byte, 65536)
			for {
				c.SetReadDeadline(end.Add(time.Second))
				if _, err := c.Read(buf); err != nil {
					if ne, ok := err.(net.Error); ok && ne.Timeout() {
						return
					}
					continue // ECONNREFUSED from an earlier send
				}
				answered.Add(1)
			}
		}()
		go func() {
			defer wg.Done()
			per := time.Second * senders / time.Duration(qps)
			next := time.Now()
			for i := 0; time.Now().Before(end); i++ {
				name := fmt.Sprintf("q%d-%d-%s.%s", s, i, run, suffix)
				c.Write(query(uint16(rand.Uint32()), name))
				sent.Add(1)
				next = next.Add(per)
				if w := time.Until(next); w > 0 {
					time.Sleep(w)
				}
			}
		}()
	}
	wg.Wait()
	fmt.Printf("sent %d answered %d\n", sent.Load(), answered.Load())
}

// holdTCP opens n connections to ns, 64 at a time, and keeps them open
// until d has passed since it started.
func holdTCP(ns string, n int, d time.Duration) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil {
		lim.Cur = lim.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	end := time.Now().Add(d)
	var mu sync.Mutex
	var conns []net.Conn
	failed := 0
	next := make(chan struct{})
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				c, err := net.DialTimeout("tcp4", ns, time.Second)
				mu.Lock()
				if err != nil {
					failed++
				} else {
					conns = append(conns, c)
				}
				mu.Unlock()
			}
		}()
	}
	for range n {
		next <- struct{}{}
	}
	close(next)
	wg.Wait()
	fmt.Printf("open %d failed %d\n", len(conns), failed)
	time.Sleep(time.Until(end))
	for _, c := range conns {
		c.Close()
	}
}
