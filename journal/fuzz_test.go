package journal

import (
	"bytes"
	"io"
	"os"
	"testing"
	"time"
)

// fuzzDir is a fresh directory, on tmpfs when there is one: the invariant
// under test does not depend on fsync, and a disk's fsync latency would
// make each input cost milliseconds.
func fuzzDir(t *testing.T) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "journal-fuzz-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

// FuzzReadSplit checks the replay invariant: for every cursor c,
// read(0, c) ++ read(c, end) equals the bytes written, on both streams,
// while the writer is still writing, and a follower started at a random
// moment and cursor reads exactly the rest of the stream.
//
// The input drives everything: byte 0 picks the segment size, then each
// byte is an op: a write of (b>>1)%64 bytes to stream b&1, and every fifth
// op a check at a cursor taken from the next byte.
//
//	go test -run '^$' -fuzz FuzzReadSplit -fuzztime 5m ./journal
func FuzzReadSplit(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte{3, 0x41, 0x42, 0xff, 0x10, 0x11, 0x7f, 0x80, 0x01, 0x02, 0x99})
	f.Add(bytes.Repeat([]byte{7, 0xfe, 0x3d, 0x12}, 60))
	f.Add([]byte{63, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || len(data) > 300 {
			return
		}
		dir := fuzzDir(t)
		w, err := Create(dir, Options{
			Streams:      []string{"stdout", "stderr"},
			SegmentBytes: int64(data[0]%120) + 8,
			SyncInterval: time.Millisecond, // index commits race with everything
		})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		j, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()
		names := [2]string{"stdout", "stderr"}
		var written [2][]byte
		type follower struct {
			s, start int
			got      chan []byte
		}
		var followers []follower
		ops := data[1:]
		for i := 0; i < len(ops); i++ {
			b := ops[i]
			s := int(b & 1)
			p := patternBytes(s, int64(len(written[s])), int(b>>1)%64)
			if n, err := w.Write(names[s], p); err != nil || n != len(p) {
				t.Fatalf("Write: got %d, %v", n, err)
			}
			written[s] = append(written[s], p...)
			if i%5 != 4 || i+1 >= len(ops) {
				continue
			}
			i++
			for s := range 2 {
				end := len(written[s])
				c := int(ops[i]) * (end + 1) / 256
				head := make([]byte, c)
				r, err := j.NewReader(names[s], 0, false)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(r, head); err != nil {
					t.Fatalf("read(0, %d) of %s: %v", c, names[s], err)
				}
				r.Close()
				tail := readRange(t, j, names[s], int64(c))
				if got := append(head, tail...); !bytes.Equal(got, written[s]) {
					t.Fatalf("%s: read(0,%d) ++ read(%d,end) is %d bytes, want the %d written", names[s], c, c, len(got), len(written[s]))
				}
			}
			if len(followers) < 2 {
				s := int(ops[i] & 1)
				start := int(ops[i]) * (len(written[s]) + 1) / 256
				r, err := j.NewReader(names[s], int64(start), true)
				if err != nil {
					t.Fatal(err)
				}
				fl := follower{s, start, make(chan []byte, 1)}
				followers = append(followers, fl)
				go func() {
					defer r.Close()
					b, err := io.ReadAll(r)
					if err != nil {
						t.Errorf("follower: %v", err)
					}
					fl.got <- b
				}()
			}
		}
		if err := w.Finish(Exit{Reason: ReasonExited}); err != nil {
			t.Fatal(err)
		}
		for _, fl := range followers {
			select {
			case got := <-fl.got:
				if want := written[fl.s][fl.start:]; !bytes.Equal(got, want) {
					t.Fatalf("follower of %s from %d: got %d bytes, want %d", names[fl.s], fl.start, len(got), len(want))
				}
			case <-time.After(10 * time.Second):
				t.Fatal("follower did not end after Finish")
			}
		}
	})
}
