module colony.bench/tls

go 1.19
