// Go's sync.Map, the peer of bench/bench_map.c: the same keys, workers
// (goroutines on GOMAXPROCS=workers) and operation mix.
//
//	map read_pct [workers=2] [keys=1000000] [ops=2000000]
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

func arg(i int, d int) int {
	if len(os.Args) > i {
		v, err := strconv.Atoi(os.Args[i])
		if err == nil {
			return v
		}
	}
	return d
}

var sink uint64

func main() {
	readpct := arg(1, 99)
	workers := arg(2, 2)
	nkeys := arg(3, 1000000)
	ops := arg(4, 2000000)
	runtime.GOMAXPROCS(workers)
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%07d", i%10000000)
	}
	var m sync.Map
	for i, k := range keys {
		m.Store(k, uintptr(i+1))
	}
	// Steady state: enough Loads to promote the stored keys to the
	// read-only map (sync.Map moves them after len(dirty) misses).
	for _, k := range keys {
		m.Load(k)
	}
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			x := seed*0x9e3779b97f4a7c15 | 1
			var acc uintptr
			for i := 0; i < ops; i++ {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				k := keys[x%uint64(nkeys)]
				if int((x>>40)%100) < readpct {
					if v, ok := m.Load(k); ok {
						acc += v.(uintptr)
					}
				} else {
					m.Store(k, uintptr(i))
				}
			}
			atomic.AddUint64(&sink, uint64(acc))
		}(uint64(w) + 1)
	}
	wg.Wait()
	dt := time.Since(t0)
	fmt.Printf("map_go_%d %.2f\n", readpct, float64(dt.Nanoseconds())/float64(ops*workers))
}
