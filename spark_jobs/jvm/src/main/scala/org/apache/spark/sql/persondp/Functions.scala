package org.apache.spark.sql.persondp

import org.apache.spark.sql.classic.SparkSession
import org.apache.spark.sql.catalyst.expressions.Expression

/** Registers person-dp's native aggregates as temporary functions of a session (called from
  * Python through py4j: spark_jobs/spark/native.py). */
object Functions {
  /** The jar's interface version: spark_jobs/spark/native.py refuses a jar of another version. */
  val VERSION: Int = 4

  /** The Spark version this jar is compiled against (keep equal to the pom's spark.version). */
  val SPARK_VERSION: String = "4.2.0"

  def register(spark: SparkSession): Unit = {
    spark.sessionState.functionRegistry.createOrReplaceTempFunction(
      "person_dp_exact_sum",
      (children: Seq[Expression]) => {
        if (children.length != 1) throw new IllegalArgumentException(s"person_dp_exact_sum takes one argument, got ${children.length}")
        ExactLimbSum(children.head)
      },
      "scala_udf")
    spark.sessionState.functionRegistry.createOrReplaceTempFunction(
      "person_dp_bottom_k",
      (children: Seq[Expression]) => {
        if (children.length != 6) {
          throw new IllegalArgumentException(s"person_dp_bottom_k takes six arguments (salt, pid, label, cnt, value, k), got ${children.length}")
        }
        val kExpr = children(5)
        if (!kExpr.foldable) throw new IllegalArgumentException("person_dp_bottom_k: k must be a constant")
        val k = kExpr.eval() match {
          case i: Int => i
          case l: Long if l >= 1 && l <= Int.MaxValue => l.toInt
          case other => throw new IllegalArgumentException(s"person_dp_bottom_k: k must be a positive integer, got $other")
        }
        BottomK(children(0), children(1), children(2), children(3), children(4), k)
      },
      "scala_udf")
  }
}
