module colony.bench/mem

go 1.19

require colony.bench/peer v0.0.0

replace colony.bench/peer => ../peer
