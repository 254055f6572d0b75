module colony.bench/net

go 1.19
