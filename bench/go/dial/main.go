// The Go peer of bench/bench_dial.c: the same modes, the same line.
//
//	dial  N C       N net.Dial+Close to a listener of this process, C goroutines
//	hosts N C       N net.DefaultResolver.LookupHost("localhost")
//	dns   N C PORT  N LookupHost("a.test") against 127.0.0.1:PORT (pure-Go resolver)
//	udp   N C       N 64-byte UDP round trips to an echo of this process
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: dial dial|hosts|dns|udp N C [PORT]")
		os.Exit(2)
	}
	mode := os.Args[1]
	n, _ := strconv.Atoi(os.Args[2])
	c, _ := strconv.Atoi(os.Args[3])
	per := n / c
	var failures int64
	var work func()
	switch mode {
	case "dial":
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		for i := 0; i < 2; i++ {
			go func() {
				for {
					conn, err := l.Accept()
					if err != nil {
						return
					}
					conn.Close()
				}
			}()
		}
		addr := l.Addr().String()
		work = func() {
			for i := 0; i < per; i++ {
				conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
				if err != nil {
					atomic.AddInt64(&failures, 1)
					continue
				}
				conn.Close()
			}
		}
	case "hosts", "dns":
		r := net.DefaultResolver
		name := "localhost"
		if mode == "dns" {
			name = "a.test"
			server := "127.0.0.1:" + os.Args[4]
			r = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, server)
			}}
		}
		work = func() {
			for i := 0; i < per; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				a, err := r.LookupHost(ctx, name)
				cancel()
				if err != nil || len(a) < 1 {
					atomic.AddInt64(&failures, 1)
				}
			}
		}
	case "udp":
		s, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		for i := 0; i < 4; i++ {
			go func() {
				buf := make([]byte, 2048)
				for {
					k, from, err := s.ReadFrom(buf)
					if err != nil {
						return
					}
					s.WriteTo(buf[:k], from)
				}
			}()
		}
		addr := s.LocalAddr().String()
		work = func() {
			conn, err := net.Dial("udp", addr)
			if err != nil {
				atomic.AddInt64(&failures, int64(per))
				return
			}
			msg, got := make([]byte, 64), make([]byte, 64)
			for i := 0; i < per; i++ {
				conn.SetReadDeadline(time.Now().Add(time.Second))
				if _, err := conn.Write(msg); err != nil {
					atomic.AddInt64(&failures, 1)
					continue
				}
				if k, err := conn.Read(got); err != nil || k != 64 {
					atomic.AddInt64(&failures, 1)
				}
			}
			conn.Close()
		}
	default:
		os.Exit(2)
	}
	var wg sync.WaitGroup
	var ru0 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	t0 := time.Now()
	for i := 0; i < c; i++ {
		wg.Add(1)
		go func() { work(); wg.Done() }()
	}
	wg.Wait()
	dt := time.Since(t0)
	ops := per * c
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	// CPU time (user + system, all threads) of the measurement
	cpu := ru.Utime.Nano() + ru.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano()
	fmt.Printf("bench=%s impl=go procs=%d ns_per_op=%.1f ops=%d peak_rss_kb=%d ops_per_s=%.0f failures=%d cpu_ns_per_op=%.0f\n",
		mode, runtime.GOMAXPROCS(0), float64(dt.Nanoseconds())/float64(ops), ops, ru.Maxrss,
		float64(ops)/dt.Seconds(), failures, float64(cpu)/float64(ops))
}
