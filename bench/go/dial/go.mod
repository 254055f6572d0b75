module colony.bench/dial

go 1.19
