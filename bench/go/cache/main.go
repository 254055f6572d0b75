// Go's sync.Pool, the peer of bench/bench_cache.c's getput row (the
// buffer rows compare the cache with glibc's malloc, in C only).
//
//	cache getput [workers=2] [ops=20000000]
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

var sink uint64

func main() {
	mode := os.Args[1]
	workers := 2
	if len(os.Args) > 2 {
		workers, _ = strconv.Atoi(os.Args[2])
	}
	if mode != "getput" {
		fmt.Fprintln(os.Stderr, "usage: cache getput [workers] [ops]")
		os.Exit(2)
	}
	ops := 20000000
	if len(os.Args) > 3 {
		ops, _ = strconv.Atoi(os.Args[3])
	}
	runtime.GOMAXPROCS(workers)
	pool := sync.Pool{New: func() any { b := make([]byte, 1024); return &b }}
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var acc uint64
			for i := 0; i < ops; i++ {
				o := pool.Get()
				pool.Put(o)
				acc++
			}
			atomic.AddUint64(&sink, acc)
		}()
	}
	wg.Wait()
	dt := time.Since(t0)
	fmt.Printf("cache_%s %.2f\n", mode, float64(dt.Nanoseconds())/float64(ops*workers))
}
