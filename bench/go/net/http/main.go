// The Go peer of examples/http_server.c for bench/run_net.sh: net/http
// serving the same bytes at / ("Hello, World!\n", text/plain; charset=utf-8,
// with Content-Length and Date, as ours). Standard library only.
//
//	httpsrv [port]    (0: any free port; the port is printed)
package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
)

var hello = []byte("Hello, World!\n")

func main() {
	port := 8081
	if len(os.Args) > 1 {
		port, _ = strconv.Atoi(os.Args[1])
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
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
	srv := &http.Server{Handler: mux}
	fmt.Printf("go httpsrv: listening on http://%s/\n", ln.Addr())
	go func() {
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
		<-c
		srv.Close()
	}()
	srv.Serve(ln)
}
