// The Go peer of bench/bench_tls.c for bench/run_tls.sh: the same three
// modes with crypto/tls (TLS 1.3, X25519, the same certificate).
//
//	tlsbench server CERT KEY
//	tlsbench handshakes PORT CONNS SECS
//	tlsbench echo PORT CONNS SECS SIZE
//	tlsbench https CERT KEY     net/http over TLS serving examples/http_server's
//	                            "/" ("Hello, World!\n"), for wrk
package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"colony.bench/peer"
)

func server(cert, key string) {
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tlsbench:", err)
		os.Exit(1)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tlsbench:", err)
		os.Exit(1)
	}
	fmt.Printf("tlsbench: listening on %s\n", ln.Addr())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				// the handshake within 10 s, as the colony server
				c.SetDeadline(time.Now().Add(10 * time.Second))
				if err := c.(*tls.Conn).Handshake(); err != nil {
					c.Close()
					return
				}
				c.SetDeadline(time.Time{})
				peer.Echo(c, 16384)
			}()
		}
	}()
	peer.WaitStop()
	os.Exit(0)
}

func https(cert, key string) {
	ln := peer.Listen(0)
	// HTTP/1.1 only, as the colony example (wrk speaks nothing else)
	srv := &http.Server{Handler: peer.Hello(), TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}}
	fmt.Printf("tlsbench: listening on https://%s/\n", ln.Addr())
	peer.OnStop(func() { os.Exit(0) })
	srv.ServeTLS(ln, cert, key)
}

func main() {
	if len(os.Args) == 4 && os.Args[1] == "https" {
		https(os.Args[2], os.Args[3])
		return
	}
	if len(os.Args) == 4 && os.Args[1] == "server" {
		server(os.Args[2], os.Args[3])
		return
	}
	hs := len(os.Args) == 5 && os.Args[1] == "handshakes"
	echo := len(os.Args) == 6 && os.Args[1] == "echo"
	if !hs && !echo {
		fmt.Fprintln(os.Stderr, "usage: tlsbench server CERT KEY | handshakes PORT CONNS SECS | echo PORT CONNS SECS SIZE")
		os.Exit(2)
	}
	port := os.Args[2]
	conns, _ := strconv.Atoi(os.Args[3])
	secs, _ := strconv.Atoi(os.Args[4])
	size := 0
	if echo {
		size, _ = strconv.Atoi(os.Args[5])
	}
	cfg := &tls.Config{InsecureSkipVerify: true} // no verification, no session cache: full handshakes
	addr := "127.0.0.1:" + port
	var count, bytes, errs int64
	t0 := time.Now()
	end := t0.Add(time.Duration(secs) * time.Second)
	var wg sync.WaitGroup
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if hs {
				for time.Now().Before(end) {
					d := net.Dialer{Timeout: 10 * time.Second}
					c, err := tls.DialWithDialer(&d, "tcp", addr, cfg)
					if err != nil {
						atomic.AddInt64(&errs, 1)
						continue
					}
					atomic.AddInt64(&count, 1)
					c.Close()
				}
				return
			}
			c, err := tls.Dial("tcp", addr, cfg)
			if err != nil {
				atomic.AddInt64(&errs, 1)
				return
			}
			defer c.Close()
			out := make([]byte, size)
			in := make([]byte, size)
			for i := range out {
				out[i] = 'x'
			}
			for time.Now().Before(end) {
				c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := c.Write(out); err != nil {
					atomic.AddInt64(&errs, 1)
					return
				}
				if _, err := io.ReadFull(c, in); err != nil {
					atomic.AddInt64(&errs, 1)
					return
				}
				atomic.AddInt64(&bytes, int64(size))
				atomic.AddInt64(&count, 1)
			}
		}()
	}
	wg.Wait()
	el := time.Since(t0).Seconds()
	if hs {
		fmt.Printf("handshakes: %d in %.2f s, %.1f/s, %d errors\n", count, el, float64(count)/el, errs)
	} else {
		fmt.Printf("echo: %d round trips of %d B in %.2f s, %.1f MiB/s, %d errors\n", count, size, el,
			float64(bytes)/el/(1<<20), errs)
	}
	// the client's CPU time (user + system, all threads), for the cost per operation
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	fmt.Printf("cpu: client_ms=%d\n", (ru.Utime.Nano()+ru.Stime.Nano())/1000000)
}
