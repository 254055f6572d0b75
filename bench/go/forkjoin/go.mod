module colony.bench/forkjoin

go 1.19
