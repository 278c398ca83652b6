"""Scale benchmark: the product's Spark passes against plain Spark and DuckDB (see benchmarks/README.md)."""
