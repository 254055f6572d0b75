module colony.bench/pool

go 1.19
