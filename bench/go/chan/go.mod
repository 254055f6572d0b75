module colony.bench/chan

go 1.19
