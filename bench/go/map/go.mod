module colonybench/map

go 1.19
