"""spark_jobs: everything that touches Spark.

- :mod:`spark_jobs.config`: YAML job configs validated into typed objects
- :mod:`spark_jobs.spark.session`: SparkSession with Delta Lake (local default, or spark-submit's master)
- :mod:`spark_jobs.spark.io`: readers for parquet / delta / csv and input validation
- :mod:`spark_jobs.spark.summarize`: the one pass from records to person summaries
- :mod:`spark_jobs.spark.aggregates`: the Spark backend of :mod:`dplib.aggregates`
- :mod:`spark_jobs.release`: the Delta ``releases`` table
- :mod:`spark_jobs.job`: :func:`run_job`, the entry point spark-submit and the CLI run
"""

from dplib import __version__  # one version, written once (dplib/__init__.py)

__all__ = ["__version__"]
