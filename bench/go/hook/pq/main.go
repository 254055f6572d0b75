// The Go peer of bench_hook's pg modes (bench/run_hook.sh): `clients`
// goroutines share `ops` SELECT 1 (or, with a third argument "prep", a
// prepared point query on bench_t) through database/sql and lib/pq, with a
// pool as large as the goroutine count, while a heartbeat goroutine sleeps
// 1 ms at a time and records its worst lateness. Prints the same
// key=value line as bench_hook (q_ops_s: the queries alone, once every
// connection is open).
package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	_ "github.com/lib/pq"
)

func procStatus(key string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, key+":") {
			f := strings.Fields(l[len(key)+1:])
			if len(f) > 0 {
				v, _ := strconv.ParseInt(f[0], 10, 64)
				return v
			}
		}
	}
	return -1
}

// the process's CPU time (user+sys) in microseconds
func cpuUs() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Sec*1000000 + ru.Utime.Usec + ru.Stime.Sec*1000000 + ru.Stime.Usec
}

func main() {
	clients, ops := 1000, 20000
	if len(os.Args) > 1 {
		clients, _ = strconv.Atoi(os.Args[1])
	}
	if len(os.Args) > 2 {
		ops, _ = strconv.Atoi(os.Args[2])
	}
	prep := len(os.Args) > 3 && os.Args[3] == "prep" // the point query on bench_t
	db, err := sql.Open("postgres", os.Getenv("BENCH_PG_DSN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	db.SetMaxOpenConns(clients)
	db.SetMaxIdleConns(clients)
	var stmt *sql.Stmt
	if prep {
		if stmt, err = db.Prepare("SELECT v FROM bench_t WHERE id = $1"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	var stop, threadsMax, worst, next, errs int64
	go func() {
		for atomic.LoadInt64(&stop) == 0 {
			if t := procStatus("Threads"); t > atomic.LoadInt64(&threadsMax) {
				atomic.StoreInt64(&threadsMax, t)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	go func() {
		for atomic.LoadInt64(&stop) == 0 {
			want := time.Now().Add(time.Millisecond)
			time.Sleep(time.Until(want))
			if late := int64(time.Since(want)); late > atomic.LoadInt64(&worst) {
				atomic.StoreInt64(&worst, late)
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)
	t0 := time.Now()
	// Every connection first, as bench_hook's clients each make one (the
	// pool would otherwise reuse idle ones and connect far fewer): held
	// until all are open, then given back to the pool (MaxIdleConns =
	// clients). The query phase (q_ops_s) starts when all are in.
	conns := make([]*sql.Conn, clients)
	var cwg sync.WaitGroup
	for i := range conns {
		cwg.Add(1)
		go func(i int) {
			defer cwg.Done()
			c, err := db.Conn(context.Background())
			if err == nil {
				err = c.PingContext(context.Background())
			}
			if err != nil {
				atomic.AddInt64(&errs, 1)
				return
			}
			conns[i] = c
		}(i)
	}
	cwg.Wait()
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
	q0, qcpu0 := time.Now(), cpuUs()
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := atomic.AddInt64(&next, 1) - 1
				if k >= int64(ops) {
					break
				}
				if prep {
					key := (k*7919)%100000 + 1
					var v int64
					if err := stmt.QueryRow(key).Scan(&v); err != nil || v != 2*key {
						atomic.AddInt64(&errs, 1)
					}
					continue
				}
				var one int
				if err := db.QueryRow("SELECT 1").Scan(&one); err != nil || one != 1 {
					atomic.AddInt64(&errs, 1)
				}
			}
		}()
	}
	wg.Wait()
	qsecs, qcpu := time.Since(q0).Seconds(), float64(cpuUs()-qcpu0)/float64(ops)
	secs := time.Since(t0).Seconds()
	atomic.StoreInt64(&stop, 1)
	db.Close()
	mode := "pg-go"
	if prep {
		mode = "pgprep-go"
	}
	fmt.Printf("mode=%s ops_s=%.0f q_ops_s=%.0f q_cpu_us=%.1f hb_worst_ms=%.2f threads_max=%d rss_kb=%d errors=%d secs=%.2f\n",
		mode, float64(ops)/secs, float64(ops)/qsecs, qcpu, float64(atomic.LoadInt64(&worst))/1e6, atomic.LoadInt64(&threadsMax),
		procStatus("VmHWM"), errs, secs)
	if errs > 0 {
		os.Exit(1)
	}
}
