module colony.bench/runtime

go 1.19
