module colonybench/cache

go 1.19
