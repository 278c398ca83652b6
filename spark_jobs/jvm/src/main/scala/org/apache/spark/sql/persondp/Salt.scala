/*
 * person-dp native salt: the run's secret salt as a column value that never prints.
 *
 * The salted keys of the per-person passes (spark_jobs/spark/keys.py) need the salt in every row
 * they hash. A literal would print in every query plan (explain(), the Spark UI, event logs); the
 * SQL path therefore joins a one-row broadcast table (~0.15-0.2 s a pass at 10^7 records: the
 * table's own small job and the join). Here the salt travels to the executors as a Spark
 * broadcast variable held by a leaf expression whose printed forms (toString, sql, the plan's
 * arguments, the comment of generated code) show only a random handle, never the salt.
 */
package org.apache.spark.sql.persondp

import java.util.UUID
import java.util.concurrent.ConcurrentHashMap

import org.apache.spark.SparkContext
import org.apache.spark.broadcast.Broadcast
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Expression, LeafExpression, Literal}
import org.apache.spark.sql.catalyst.expressions.codegen.{CodegenContext, ExprCode, FalseLiteral}
import org.apache.spark.sql.catalyst.expressions.codegen.Block._
import org.apache.spark.sql.classic.SparkSession
import org.apache.spark.sql.types.{DataType, StringType}
import org.apache.spark.unsafe.types.UTF8String

/** The salts of the live SparkContext, each broadcast once, by random handle. Entries of a
  * stopped context are dropped when a new one registers. */
object Salts {
  private final case class Entry(sc: SparkContext, handle: String, value: Broadcast[Array[Byte]])
  private val byHandle = new ConcurrentHashMap[String, Entry]()
  private val bySalt = new ConcurrentHashMap[String, Entry]()

  /** The handle of `salt` in `spark`'s context (broadcast on first use; the same handle after). */
  def handle(spark: SparkSession, salt: String): String = synchronized {
    val sc = spark.sparkContext
    val known = bySalt.get(salt)
    if (known != null && (known.sc eq sc) && !sc.isStopped) return known.handle
    byHandle.values().removeIf(e => e.sc.isStopped || !(e.sc eq sc))
    bySalt.values().removeIf(e => e.sc.isStopped || !(e.sc eq sc))
    val e = Entry(sc, UUID.randomUUID().toString, sc.broadcast(salt.getBytes("UTF-8")))
    byHandle.put(e.handle, e)
    bySalt.put(salt, e)
    e.handle
  }

  /** The expression for `handle` (function builder of `person_dp_salt`). */
  def expression(handle: String): PersonDpSalt = {
    val e = byHandle.get(handle)
    if (e == null || e.sc.isStopped) {
      throw new IllegalArgumentException("person_dp_salt: unknown salt handle (register the salt in this session first)")
    }
    PersonDpSalt(handle, e.value)
  }

  /** Number of live salts (tests). */
  def size: Int = byHandle.size
}

/** The salt of `handle` as a string column value (the same in every row). Not foldable, so the
  * optimizer never turns it into a literal; its printed forms show the handle only. */
case class PersonDpSalt(handle: String, salt: Broadcast[Array[Byte]]) extends LeafExpression {
  @transient private lazy val value: UTF8String = UTF8String.fromBytes(salt.value)

  /** The salt (called by generated code). */
  def saltValue(): UTF8String = value

  override def dataType: DataType = StringType
  override def nullable: Boolean = false
  override def foldable: Boolean = false
  override def eval(input: InternalRow): Any = value
  override protected def doGenCode(ctx: CodegenContext, ev: ExprCode): ExprCode = {
    val ref = ctx.addReferenceObj("personDpSalt", this, classOf[PersonDpSalt].getName)
    ev.copy(code = code"final UTF8String ${ev.value} = $ref.saltValue();", isNull = FalseLiteral)
  }
  override def flatArguments: Iterator[Any] = Iterator(handle)
  override def toString: String = s"person_dp_salt($handle)"
  override def sql: String = s"person_dp_salt('$handle')"
  override def prettyName: String = "person_dp_salt"
}

/** Builder of `person_dp_salt('handle')`. */
private[persondp] object SaltFunction {
  def build(children: Seq[Expression]): Expression = children match {
    case Seq(Literal(h: UTF8String, StringType)) => Salts.expression(h.toString)
    case _ => throw new IllegalArgumentException("person_dp_salt takes one argument: a string literal handle from Salts.handle")
  }
}
