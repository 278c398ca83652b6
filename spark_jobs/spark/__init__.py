"""The only code that imports pyspark: the Spark side of the seam (:mod:`dplib.seam`).

- :mod:`.session`: SparkSession with Delta Lake (local default, or spark-submit's master)
- :mod:`.io`: readers for parquet / delta / csv and input validation
- :mod:`.summarize`: the one pass from records to person summaries
- :mod:`.aggregates`: ``SparkAggregates``, the Spark twin of :class:`dplib.aggregates.NumpyAggregates`
- :mod:`.batches`, :mod:`.fixed_n`: per-person batches and category shares
- :mod:`.keys`: the salt joined as data, group indices and record keys (summarize and batches)
- :mod:`.vectors`: person vectors for BHS23
- :mod:`.releases`: writes the Delta ``releases`` table
"""
