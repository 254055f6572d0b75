// Package peer holds what the Go peers of the C benchmarks share: for the
// servers, the port argument, a listener on 127.0.0.1, the stop on SIGINT
// or SIGTERM, the echo loop and examples/http_server's "/"; for the
// sub-benchmark commands, their arguments, GOMAXPROCS, the resident set
// and the output line. Standard library only.
package peer

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// PortArg is the port the first argument names (0: any free port), or
// def when there is none.
func PortArg(def int) int {
	if len(os.Args) > 1 {
		port, _ := strconv.Atoi(os.Args[1])
		return port
	}
	return def
}

// Listen listens on 127.0.0.1:port (0: any free port); on an error it
// says so and exits with status 1.
func Listen(port int) net.Listener {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return ln
}

func stopSignals() chan os.Signal {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	return c
}

// WaitStop returns once SIGINT or SIGTERM arrives.
func WaitStop() {
	<-stopSignals()
}

// OnStop runs fn on a goroutine of its own once SIGINT or SIGTERM
// arrives (one that arrives after OnStop has returned).
func OnStop(fn func()) {
	c := stopSignals()
	go func() {
		<-c
		fn()
	}()
}

// Echo writes back what c sends, through a buffer of size bytes, until
// the end of its input or an error; then it closes c.
func Echo(c net.Conn, size int) {
	defer c.Close()
	buf := make([]byte, size)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

var hello = []byte("Hello, World!\n")

// Hello serves what examples/http_server.c serves: "Hello, World!\n" at
// / (text/plain; charset=utf-8, with Content-Length; net/http adds the
// Date), 404 elsewhere.
func Hello() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("Content-Length", strconv.Itoa(len(hello)))
		w.Write(hello)
	})
	return mux
}

// ---- the sub-benchmarks' arguments and output line ---------------------------

// Args are a sub-benchmark's arguments (those after its name), for Arg.
var Args []string

// Arg is Args[i] as a positive number, def where it is missing or empty;
// anything else ends the program with status 2.
func Arg(i int, def int64) int64 {
	if i < len(Args) && Args[i] != "" {
		v, err := strconv.ParseInt(Args[i], 10, 64)
		if err != nil || v <= 0 {
			fmt.Fprintf(os.Stderr, "bad argument '%s'\n", Args[i])
			os.Exit(2)
		}
		return v
	}
	return def
}

// SetProcs sets GOMAXPROCS to Arg(0, def), the first argument of every
// sub-benchmark, and returns it.
func SetProcs(def int64) int {
	p := int(Arg(0, def))
	runtime.GOMAXPROCS(p)
	return p
}

// PeakRSSKB is the process's peak resident set (getrusage: KiB on Linux),
// -1 if unknown.
func PeakRSSKB() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Maxrss
}

// CurRSSKB is the process's resident set now (/proc/self/statm, 4 KiB
// pages), -1 if unknown.
func CurRSSKB() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return -1
	}
	var size, res int64
	if _, err := fmt.Sscan(string(b), &size, &res); err != nil {
		return -1
	}
	return res * 4
}

// StatusKB is the number /proc/self/status gives for key (VmRSS, VmPTE,
// VmHWM: KiB; Threads: a count), -1 if unknown.
func StatusKB(key string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, key+":") {
			if f := strings.Fields(l[len(key)+1:]); len(f) > 0 {
				if v, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return v
				}
			}
			return -1
		}
	}
	return -1
}

// Report prints the output line the C benchmarks print (impl=go), extra
// (" key=value"...) at its end.
func Report(name string, procs int, nsPerOp float64, ops int64, extra string) {
	fmt.Printf("bench=%s impl=go procs=%d ns_per_op=%.2f ops=%d peak_rss_kb=%d%s\n",
		name, procs, nsPerOp, ops, PeakRSSKB(), extra)
}
