module colony.bench/mem

go 1.19
