package keyed

import (
	"sync"
	"testing"
	"time"
)

// TestMutex: one key's holders exclude each other, other keys do not
// wait, and a key no caller holds or waits for is dropped.
func TestMutex(t *testing.T) {
	var k Mutex
	unlockA := k.Lock("a")
	unlockB := k.Lock("b") // another key: no wait
	got := make(chan struct{})
	go func() {
		unlock := k.Lock("a")
		close(got)
		unlock()
	}()
	select {
	case <-got:
		t.Fatal("a second holder of key a got it while the first held it")
	case <-time.After(50 * time.Millisecond):
	}
	unlockA()
	<-got
	unlockB()
	if n := k.Len(); n != 0 {
		t.Fatalf("Len after every unlock: %d, want 0", n)
	}
	var wg sync.WaitGroup
	n := 0
	for range 100 {
		wg.Go(func() {
			defer k.Lock("c")()
			n++ // the race detector watches this
		})
	}
	wg.Wait()
	if n != 100 || k.Len() != 0 {
		t.Fatalf("n %d Len %d, want 100 and 0", n, k.Len())
	}
}
