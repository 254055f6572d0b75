module colony.bench/peer

go 1.19
