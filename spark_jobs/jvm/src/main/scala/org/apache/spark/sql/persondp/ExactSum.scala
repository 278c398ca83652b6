/*
 * person-dp native aggregates: the exact per-person sum of the summarize pass.
 *
 * The pure Spark SQL path (spark_jobs/spark/summarize.py) and the numpy twin (dplib/summary.py)
 * define the same result; this is their native form, tested bit for bit against both.
 */
package org.apache.spark.sql.persondp

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{AttributeReference, BoundReference, Expression, ImplicitCastInputTypes}
import org.apache.spark.sql.catalyst.expressions.aggregate.ImperativeAggregate
import org.apache.spark.sql.catalyst.trees.UnaryLike
import org.apache.spark.sql.catalyst.types.DataTypeUtils
import org.apache.spark.sql.types.{AbstractDataType, DataType, DoubleType, LongType, StructField, StructType}

/** Fixed-point arithmetic of dplib.summary (module docstring there):
  * a finite value v, clamped to [-CLAMP, CLAMP], contributes sign(v) * floor(|v| 2^SHIFT), an
  * integer below 2^248. The exact sum N of a person's contributions is kept as five digits of
  * base 2^62: d0..d3 in [0, 2^62) and a signed d4 (everything from 2^248 up), the unique
  * representation of N (carries propagated on every addition, so no digit ever overflows,
  * whatever the number of records).
  *
  * The person's double total, as dplib.summary.total_from_limb_sums defines it: the canonical
  * base-2^31 digits e0..e7 in [0, 2^31) and the signed e8 = d4, added in double high digit first,
  * total = (...((e8 2^98 + e7 2^67) + e6 2^36) + ... + e0 2^-150). */
object ExactSumMath {
  final val SHIFT = 150
  final val DIGIT_BITS = 62
  final val DIGITS = 5 // d0..d3 unsigned, d4 signed
  final val MASK62: Long = (1L << 62) - 1
  final val LIMB_BITS = 31
  final val MASK31: Long = (1L << 31) - 1
  /** The largest double below 2^98 (dplib.summary.CLAMP). */
  final val CLAMP: Double = java.lang.Math.scalb((1L << 53).toDouble - 1.0, 45)
  private val SCALE: Array[Double] = Array.tabulate(9)(i => java.lang.Math.scalb(1.0, LIMB_BITS * i - SHIFT))

  /** Adds `delta` (|delta| < 2^62) at digit `j` of the digits at `b(o)..b(o + 4)`, propagating
    * the carry. */
  @inline def addAt(b: InternalRow, o: Int, j: Int, delta: Long): Unit = {
    var k = j
    var c = delta
    while (c != 0 && k < DIGITS - 1) {
      val t = b.getLong(o + k) + c // digit in [0, 2^62), |c| < 2^62: no overflow
      b.setLong(o + k, t & MASK62)
      c = t >> DIGIT_BITS // floor(t / 2^62)
      k += 1
    }
    if (c != 0) b.setLong(o + DIGITS - 1, b.getLong(o + DIGITS - 1) + c)
  }

  /** Adds the contribution of the finite double `x` to the digits at `b(o)..b(o + 4)`. */
  def addValue(b: InternalRow, o: Int, x: Double): Unit = {
    val v = if (x > CLAMP) CLAMP else if (x < -CLAMP) -CLAMP else x
    val bits = java.lang.Double.doubleToRawLongBits(v)
    val e = ((bits >>> 52) & 0x7ffL).toInt
    var mant = bits & 0xfffffffffffffL
    if (e == 0 && mant == 0) return // +-0
    // |v| = mant 2^(e - 1075) (normal) or mant 2^-1074 (subnormal); s = the shift of mant in N
    val s = if (e == 0) -1074 + SHIFT else { mant |= 1L << 52; e - 1075 + SHIFT }
    val neg = bits < 0
    if (s < 0) {
      val q = if (-s >= 63) 0L else mant >>> -s // floor: truncation toward zero of |v| 2^SHIFT
      if (q != 0) addAt(b, o, 0, if (neg) -q else q)
    } else {
      val j = s / DIGIT_BITS
      val off = s % DIGIT_BITS
      val lo = (mant << off) & MASK62
      val hi = if (off == 0) 0L else mant >>> (DIGIT_BITS - off)
      if (lo != 0) addAt(b, o, j, if (neg) -lo else lo)
      if (hi != 0) addAt(b, o, j + 1, if (neg) -hi else hi)
    }
  }

  /** The double total of the digits (object docstring). */
  def total(d0: Long, d1: Long, d2: Long, d3: Long, d4: Long): Double = {
    val ds = Array(d0, d1, d2, d3)
    var t = 0.0
    t = t + d4.toDouble * SCALE(8)
    var i = 7
    while (i >= 0) {
      val dk = ds(i / 2)
      val e = if ((i & 1) == 1) dk >>> LIMB_BITS else dk & MASK31
      t = t + e.toDouble * SCALE(i)
      i -= 1
    }
    t
  }
}

/** `person_dp_exact_sums(x1, ..., xd)`: per group, for each argument the number of its finite
  * values (nulls, NaN and +-inf skipped) and their exact fixed-point sum as a double
  * (ExactSumMath), as `struct<m0: bigint, total0: double, ..., m{d-1}, total{d-1}>`. Partially
  * aggregable (map-side), independent of the order of rows and of partitioning. */
case class ExactSums(children: Seq[Expression], mutableAggBufferOffset: Int = 0, inputAggBufferOffset: Int = 0)
    extends ImperativeAggregate with ImplicitCastInputTypes {

  import ExactSumMath._

  private val width = DIGITS + 1

  override def prettyName: String = "person_dp_exact_sums"
  override def nullable: Boolean = false
  override def dataType: DataType = StructType(children.indices.flatMap(i => Seq(
    StructField(s"m$i", LongType, nullable = false), StructField(s"total$i", DoubleType, nullable = false))))
  override def inputTypes: Seq[AbstractDataType] = children.map(_ => DoubleType)

  override lazy val aggBufferAttributes: Seq[AttributeReference] = children.indices.flatMap(c =>
    AttributeReference(s"m$c", LongType, nullable = false)() +:
      (0 until DIGITS).map(i => AttributeReference(s"d${c}_$i", LongType, nullable = false)()))
  override lazy val inputAggBufferAttributes: Seq[AttributeReference] = aggBufferAttributes.map(_.newInstance())
  override def aggBufferSchema: StructType = DataTypeUtils.fromAttributes(aggBufferAttributes)

  override def withNewMutableAggBufferOffset(n: Int): ImperativeAggregate = copy(mutableAggBufferOffset = n)
  override def withNewInputAggBufferOffset(n: Int): ImperativeAggregate = copy(inputAggBufferOffset = n)
  override protected def withNewChildrenInternal(newChildren: IndexedSeq[Expression]): ExactSums = copy(children = newChildren)

  @transient private lazy val kids: Array[Expression] = children.toArray
  // a bound column reference is read straight from the row (no boxing); -1: evaluate the child
  @transient private lazy val ordinals: Array[Int] = kids.map {
    case b: BoundReference if b.dataType == DoubleType => b.ordinal
    case _ => -1
  }

  override def initialize(buffer: InternalRow): Unit = {
    var i = 0
    val n = kids.length * width
    while (i < n) { buffer.setLong(mutableAggBufferOffset + i, 0L); i += 1 }
  }

  override def update(buffer: InternalRow, input: InternalRow): Unit = {
    var c = 0
    var o = mutableAggBufferOffset
    while (c < kids.length) {
      val ord = ordinals(c)
      var x = Double.NaN
      if (ord >= 0) {
        if (!input.isNullAt(ord)) x = input.getDouble(ord)
      } else {
        val v = kids(c).eval(input)
        if (v != null) x = v.asInstanceOf[Double]
      }
      if (!java.lang.Double.isNaN(x) && !java.lang.Double.isInfinite(x)) {
        buffer.setLong(o, buffer.getLong(o) + 1)
        addValue(buffer, o + 1, x)
      }
      c += 1
      o += width
    }
  }

  override def merge(buffer: InternalRow, input: InternalRow): Unit = {
    var col = 0
    while (col < kids.length) {
      val o = mutableAggBufferOffset + col * width
      val p = inputAggBufferOffset + col * width
      buffer.setLong(o, buffer.getLong(o) + input.getLong(p))
      var c = 0L
      var i = 0
      while (i < DIGITS - 1) {
        val t = buffer.getLong(o + 1 + i) + input.getLong(p + 1 + i) + c
        buffer.setLong(o + 1 + i, t & MASK62)
        c = t >> DIGIT_BITS
        i += 1
      }
      buffer.setLong(o + DIGITS, buffer.getLong(o + DIGITS) + input.getLong(p + DIGITS) + c)
      col += 1
    }
  }

  override def eval(buffer: InternalRow): Any = {
    val out = new Array[Any](2 * kids.length)
    var col = 0
    while (col < kids.length) {
      val o = mutableAggBufferOffset + col * width
      out(2 * col) = buffer.getLong(o)
      out(2 * col + 1) = total(buffer.getLong(o + 1), buffer.getLong(o + 2), buffer.getLong(o + 3), buffer.getLong(o + 4), buffer.getLong(o + 5))
      col += 1
    }
    InternalRow.fromSeq(out.toIndexedSeq)
  }
}
