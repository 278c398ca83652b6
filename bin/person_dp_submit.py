"""spark-submit entry point of person-dp: the same ``person-dp`` command line, run by spark-submit.

    spark-submit --master local-cluster[2,1,1024] \
        --py-files build/dist/person_dp.zip \
        --jars "$(.venv/bin/person-dp spark-jars)" \
        bin/person_dp_submit.py run --config conf/examples/flights.yaml --run-id 2026-11-29

It only calls :func:`spark_jobs.cli.main` (imported from the zip given with ``--py-files`` or from
the installed package). It lives outside the package so that spark-submit, which puts the
script's own folder first on ``sys.path``, does not put ``spark_jobs/`` there (its module names
``io``, ``config``, ``session`` ... would shadow top-level modules).
"""

import sys

from spark_jobs.cli import main


def _run() -> int:
    try:
        return main()
    finally:
        # stop Spark cleanly: executors and, under local-cluster, the workers shut down in order
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()


if __name__ == "__main__":
    sys.exit(_run())
