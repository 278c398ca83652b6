/*
 * person-dp native aggregates: the exact per-person sum of one column as a declarative
 * (code-generated) Catalyst aggregate.
 *
 * The pure Spark SQL path (spark_jobs/spark/summarize.py) and the numpy twin (dplib/summary.py)
 * define the same result; this is their native form, tested bit for bit against both. It is a
 * declarative aggregate, so Spark compiles its update into the aggregation's generated code
 * (whole-stage code generation and its fast hash map); an imperative aggregate (the jar's first
 * form, interface version 3) ran row by row outside it: 1.4x slower at d = 1 (10^7 records).
 */
package org.apache.spark.sql.persondp

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Add, AttributeReference, BitwiseAnd, CreateNamedStruct, EvalMode, Expression, ImplicitCastInputTypes, Literal, ShiftRight, UnaryExpression}
import org.apache.spark.sql.catalyst.expressions.aggregate.DeclarativeAggregate
import org.apache.spark.sql.catalyst.expressions.codegen.{CodegenContext, ExprCode, FalseLiteral}
import org.apache.spark.sql.catalyst.expressions.codegen.Block._
import org.apache.spark.sql.catalyst.trees.UnaryLike
import org.apache.spark.sql.types.{AbstractDataType, DataType, DoubleType, LongType}

/** The fixed-point arithmetic of dplib.summary, in the form a generated aggregation can update:
  * a finite value v, clamped to [-CLAMP, CLAMP], stands for the integer sign(v) N with
  * N = floor(|v| 2^SHIFT) < 2^248. A person's exact sum is kept as five signed longs s_0..s_4
  * worth sum_i s_i 2^(61 i), in carry-save form: every update and merge moves each slot's carry
  * (s_i >> 61, a floor) up one slot and keeps its remainder (s_i & (2^61 - 1)), then adds the
  * value's digits (sign(v) ((N >> 61 i) mod 2^61); at most two are non-zero). So slots 0..3 stay
  * in (-2^62, 2^62) after an update and (-2^63, 2^63) after a merge, whatever the number of
  * records (no overflow, no chain of carries per row), and s_4 collects everything from 2^244
  * up (it grows by at most 17 a record: a wrap would need ~5 10^17 records of |v| >= 2^94 in one
  * group). The total normalises the slots once (carries low to high:
  * the canonical digits, unique), cuts N into the base-2^31 digits e0..e7 and the signed e8 of
  * dplib.summary.total_from_limb_sums and adds them in double high digit first, as it does.
  *
  * A value enters as one long (`fixed`, computed once per value): 0 when N = 0 (zero, NaN,
  * +-inf, null, |v| < 2^-150), else the 53-bit significand in bits 0..52, s + 64 in bits 53..61
  * (N = significand 2^s, floor for s < 0; s in [-52, 195]) and the sign in bit 62. */
object LimbMath {
  final val SHIFT = 150
  final val DIGIT_BITS = 61
  final val SLOTS = 5
  final val MASK61: Long = (1L << 61) - 1
  final val LIMB_BITS = 31
  final val MASK31: Long = (1L << 31) - 1
  private final val MANT: Long = (1L << 53) - 1
  /** The largest double below 2^98 (dplib.summary.CLAMP). */
  final val CLAMP: Double = java.lang.Math.scalb((1L << 53).toDouble - 1.0, 45)
  private val SCALE: Array[Double] = Array.tabulate(9)(i => java.lang.Math.scalb(1.0, LIMB_BITS * i - SHIFT))

  /** 1 for a finite double, 0 for NaN and +-inf. */
  def finiteOne(x: Double): Long = if (java.lang.Double.isNaN(x) || java.lang.Double.isInfinite(x)) 0L else 1L

  /** The `fixed` form of `x` (class docstring). */
  def fixed(x: Double): Long = {
    if (java.lang.Double.isNaN(x) || java.lang.Double.isInfinite(x)) return 0L
    val v = if (x > CLAMP) CLAMP else if (x < -CLAMP) -CLAMP else x
    val bits = java.lang.Double.doubleToRawLongBits(v)
    val e = ((bits >>> 52) & 0x7ffL).toInt
    if (e == 0) return 0L // zero or subnormal: |v| < 2^-1022, N = 0
    val s = e - 1075 + SHIFT
    if (s <= -53) return 0L // N = floor(significand 2^s) = 0
    val mant = (bits & 0xfffffffffffffL) | (1L << 52)
    mant | ((s + 64).toLong << 53) | (if (bits < 0) 1L << 62 else 0L)
  }

  /** Digit `i` (0..4) of a `fixed` value: sign(v) ((N >> 61 i) mod 2^61). */
  def digit(f: Long, i: Int): Long = {
    if (f == 0L) return 0L
    val mant = f & MANT
    val k = (((f >>> 53) & 0x1ffL).toInt - 64) - DIGIT_BITS * i // N >> 61 i = mant << k, or mant >>> -k
    val u =
      if (k >= DIGIT_BITS) 0L
      else if (k >= 0) (mant << k) & MASK61
      else if (k <= -53) 0L
      else mant >>> -k
    if ((f & (1L << 62)) != 0) -u else u
  }

  /** The double total of carry-save slots s0..s4 (class docstring). */
  def total(s0: Long, s1: Long, s2: Long, s3: Long, s4: Long): Double = {
    // canonical base-2^61 digits d0..d3 in [0, 2^61) and the signed top d4 (from 2^244 up)
    var t = s0; val d0 = t & MASK61; var c = t >> DIGIT_BITS
    t = s1 + c; val d1 = t & MASK61; c = t >> DIGIT_BITS
    t = s2 + c; val d2 = t & MASK61; c = t >> DIGIT_BITS
    t = s3 + c; val d3 = t & MASK61; c = t >> DIGIT_BITS
    val d4 = s4 + c
    val d = Array(d0, d1, d2, d3, d4)
    // base-2^31 digit j: bits 31 j .. 31 j + 30 of N (two's complement above 2^244)
    def e(j: Int): Long = {
      val p = LIMB_BITS * j
      val q = p / DIGIT_BITS
      val off = p % DIGIT_BITS
      val lo = d(q) >>> off
      val hi = if (off + LIMB_BITS > DIGIT_BITS) d(q + 1) << (DIGIT_BITS - off) else 0L
      (lo | hi) & MASK31
    }
    var r = 0.0
    r = r + (d4 >> 4).toDouble * SCALE(8) // N >> 248
    var j = 7
    while (j >= 0) { r = r + e(j).toDouble * SCALE(j); j -= 1 }
    r
  }
}

/** A long function of a double column (a static method of LimbMath; 0 for null), code-generated. */
abstract class LongOfDouble extends UnaryExpression {
  /** The LimbMath method. */
  protected def method: String
  protected def f(x: Double): Long
  override def dataType: DataType = LongType
  override def nullable: Boolean = false
  override def eval(input: InternalRow): Any = {
    val v = child.eval(input)
    if (v == null) 0L else f(v.asInstanceOf[Double])
  }
  override protected def doGenCode(ctx: CodegenContext, ev: ExprCode): ExprCode = {
    val c = child.genCode(ctx)
    ev.copy(code = code"""${c.code}
      |long ${ev.value} = ${c.isNull} ? 0L : org.apache.spark.sql.persondp.LimbMath.$method(${c.value});""".stripMargin,
      isNull = FalseLiteral)
  }
}

/** The `fixed` form of a double column (LimbMath.fixed; 0 for null). */
case class PersonDpFixed(child: Expression) extends LongOfDouble {
  override protected def method: String = "fixed"
  override protected def f(x: Double): Long = LimbMath.fixed(x)
  override protected def withNewChildInternal(newChild: Expression): PersonDpFixed = copy(child = newChild)
}

/** 1 for a finite double, 0 for null, NaN and +-inf (LimbMath.finiteOne). */
case class PersonDpFinite(child: Expression) extends LongOfDouble {
  override protected def method: String = "finiteOne"
  override protected def f(x: Double): Long = LimbMath.finiteOne(x)
  override protected def withNewChildInternal(newChild: Expression): PersonDpFinite = copy(child = newChild)
}

/** Digit `i` of a `fixed` long (LimbMath.digit), code-generated. */
case class PersonDpLimb(child: Expression, i: Int) extends UnaryExpression {
  override def dataType: DataType = LongType
  override def nullable: Boolean = false
  override def eval(input: InternalRow): Any = LimbMath.digit(child.eval(input).asInstanceOf[Long], i)
  override protected def doGenCode(ctx: CodegenContext, ev: ExprCode): ExprCode = {
    val c = child.genCode(ctx)
    ev.copy(code = code"""${c.code}
      |long ${ev.value} = org.apache.spark.sql.persondp.LimbMath.digit(${c.value}, $i);""".stripMargin,
      isNull = FalseLiteral)
  }
  override protected def withNewChildInternal(newChild: Expression): PersonDpLimb = copy(child = newChild)
}

/** The double total of five carry-save slots (LimbMath.total). */
case class PersonDpLimbTotal(children: Seq[Expression]) extends Expression {
  require(children.length == LimbMath.SLOTS)
  override def dataType: DataType = DoubleType
  override def nullable: Boolean = false
  override def eval(input: InternalRow): Any = {
    val s = children.map(_.eval(input).asInstanceOf[Long])
    LimbMath.total(s(0), s(1), s(2), s(3), s(4))
  }
  override protected def doGenCode(ctx: CodegenContext, ev: ExprCode): ExprCode = {
    val cs = children.map(_.genCode(ctx))
    ev.copy(code = code"""${cs.map(_.code).reduce(_ + _)}
      |double ${ev.value} = org.apache.spark.sql.persondp.LimbMath.total(${cs.map(_.value.toString).mkString(", ")});""".stripMargin,
      isNull = FalseLiteral)
  }
  override protected def withNewChildrenInternal(newChildren: IndexedSeq[Expression]): PersonDpLimbTotal = copy(children = newChildren)
}

/** `person_dp_exact_sum(x)`: per group, `struct<m: bigint, total: double>`, the number of finite
  * values of `x` (nulls, NaN and +-inf skipped) and their exact fixed-point sum as a double
  * (LimbMath). Declarative: Spark generates its update and merge code; partially aggregable,
  * independent of row order and partitioning (the slots' value is an exact integer sum; the
  * total reads their canonical digits). */
case class ExactLimbSum(child: Expression) extends DeclarativeAggregate with ImplicitCastInputTypes with UnaryLike[Expression] {
  import LimbMath._

  override def prettyName: String = "person_dp_exact_sum"
  override def nullable: Boolean = false
  override def dataType: DataType = CreateNamedStruct(Seq(Literal("m"), Literal(0L), Literal("total"), Literal(0.0))).dataType
  override def inputTypes: Seq[AbstractDataType] = Seq(DoubleType)

  private lazy val m = AttributeReference("m", LongType, nullable = false)()
  private lazy val slots: Seq[AttributeReference] = (0 until SLOTS).map(i => AttributeReference(s"s$i", LongType, nullable = false)())

  override lazy val aggBufferAttributes: Seq[AttributeReference] = m +: slots
  override lazy val initialValues: Seq[Expression] = Seq.fill(SLOTS + 1)(Literal(0L))

  private def add(a: Expression, b: Expression): Expression = Add(a, b, EvalMode.LEGACY) // bounded: no overflow (LimbMath)
  private def low(e: Expression): Expression = BitwiseAnd(e, Literal(MASK61))
  private def carry(e: Expression): Expression = ShiftRight(e, Literal(DIGIT_BITS))

  /** Slot i of the slots `a` after one carry-save step (the same value: class docstring of LimbMath). */
  private def step(a: Seq[Expression], i: Int): Expression =
    if (i == 0) low(a(0)) else if (i < SLOTS - 1) add(low(a(i)), carry(a(i - 1))) else add(a(i), carry(a(i - 1)))

  override lazy val updateExpressions: Seq[Expression] = {
    val f = PersonDpFixed(child) // one per value: Spark's subexpression elimination shares it
    add(m, PersonDpFinite(child)) +: (0 until SLOTS).map(i => add(step(slots, i), PersonDpLimb(f, i)))
  }

  override lazy val mergeExpressions: Seq[Expression] = {
    val l = slots.map(_.left)
    val r = slots.map(_.right)
    add(m.left, m.right) +: (0 until SLOTS).map(i => add(step(l, i), step(r, i)))
  }

  override lazy val evaluateExpression: Expression =
    CreateNamedStruct(Seq(Literal("m"), m, Literal("total"), PersonDpLimbTotal(slots)))

  override protected def withNewChildInternal(newChild: Expression): ExactLimbSum = copy(child = newChild)
}
