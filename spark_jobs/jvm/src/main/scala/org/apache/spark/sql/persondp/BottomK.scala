/*
 * person-dp native aggregates: the keyed-hash bottom-k of the per-person draws (batches, record cap).
 */
package org.apache.spark.sql.persondp

import java.io.{ByteArrayInputStream, ByteArrayOutputStream, DataInputStream, DataOutputStream}
import java.nio.charset.StandardCharsets
import java.security.MessageDigest

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Expression, GenericInternalRow, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.catalyst.expressions.aggregate.TypedImperativeAggregate
import org.apache.spark.sql.catalyst.util.GenericArrayData
import org.apache.spark.sql.types.{ArrayType, DataType, IntegerType, LongType, StringType, StructField, StructType}

/** The k smallest entries seen, by key (k1, k2): a max-heap of at most k entries. */
final class KeyHeap(val k: Int) {
  var size = 0
  var k1 = new Array[Long](math.min(k, 16))
  var k2 = new Array[Long](math.min(k, 16))
  var values = new Array[Any](math.min(k, 16))

  @inline private def greater(i: Int, j: Int): Boolean =
    k1(i) > k1(j) || (k1(i) == k1(j) && k2(i) > k2(j))

  @inline private def swap(i: Int, j: Int): Unit = {
    val a = k1(i); k1(i) = k1(j); k1(j) = a
    val b = k2(i); k2(i) = k2(j); k2(j) = b
    val c = values(i); values(i) = values(j); values(j) = c
  }

  /** True when an entry of key (a, b) would enter the heap. */
  @inline def admits(a: Long, b: Long): Boolean =
    size < k || a < k1(0) || (a == k1(0) && b < k2(0))

  /** Adds (a, b, v) when it is among the k smallest (`v` must not be reused by the caller). */
  def offer(a: Long, b: Long, v: Any): Unit = {
    if (size < k) {
      if (size == k1.length) {
        val n = math.min(k, 2 * size)
        k1 = java.util.Arrays.copyOf(k1, n); k2 = java.util.Arrays.copyOf(k2, n)
        values = java.util.Arrays.copyOf(values.asInstanceOf[Array[AnyRef]], n).asInstanceOf[Array[Any]]
      }
      k1(size) = a; k2(size) = b; values(size) = v
      var i = size
      size += 1
      while (i > 0 && greater(i, (i - 1) / 2)) { swap(i, (i - 1) / 2); i = (i - 1) / 2 }
    } else if (admits(a, b)) {
      k1(0) = a; k2(0) = b; values(0) = v
      var i = 0
      var done = false
      while (!done) {
        val l = 2 * i + 1
        val r = l + 1
        var top = i
        if (l < size && greater(l, top)) top = l
        if (r < size && greater(r, top)) top = r
        if (top == i) done = true else { swap(i, top); i = top }
      }
    }
  }

  /** Entry indices in increasing key order. */
  def sortedIndices: Array[Int] = (0 until size).sortWith((i, j) => greater(j, i)).toArray
}

/** `person_dp_bottom_k(salt, pid, label, cnt, value, k)`: per group (person), the `value`s of the
  * `k` records with the smallest keyed hashes, as an array in increasing key order.
  *
  * Each input row stands for `cnt` identical records of person `pid` named `label` (a hex
  * string); copy `j` (0 <= j < cnt) gets the key SHA-256(salt || pid || 0x1f || label || ":" || j)
  * (UTF-8; j in decimal), compared as the two 60-bit integers of its first 30 hex digits: the
  * keyed-hash order of dplib.distribution.batches.record_keys, and the same choice as Spark's
  * `min_by(value, struct(substring(hex key, 1, 30), value), k)` over the copies (identical keys
  * mean identical records, so no further tie-break is needed). Mergeable (the k smallest of a
  * union are the k smallest of the parts' k smallest), hence map-side partial aggregation; no
  * record is numbered into a row or sorted. Memory: at most k entries per person and task. */
case class BottomK(
    salt: Expression, pid: Expression, label: Expression, cnt: Expression, value: Expression, k: Int,
    mutableAggBufferOffset: Int = 0, inputAggBufferOffset: Int = 0)
    extends TypedImperativeAggregate[KeyHeap] {

  override def children: Seq[Expression] = Seq(salt, pid, label, cnt, value)

  override def prettyName: String = "person_dp_bottom_k"
  override def nullable: Boolean = false
  override def dataType: DataType = ArrayType(value.dataType, containsNull = value.nullable)

  override def checkInputDataTypes(): org.apache.spark.sql.catalyst.analysis.TypeCheckResult = {
    import org.apache.spark.sql.catalyst.analysis.TypeCheckResult._
    if (salt.dataType != StringType || pid.dataType != StringType || label.dataType != StringType) {
      TypeCheckFailure("person_dp_bottom_k: salt, pid and label must be strings")
    } else if (cnt.dataType != LongType && cnt.dataType != IntegerType) {
      TypeCheckFailure("person_dp_bottom_k: cnt must be a bigint or int")
    } else if (k < 1) {
      TypeCheckFailure("person_dp_bottom_k: k must be at least 1")
    } else TypeCheckSuccess
  }

  override def withNewMutableAggBufferOffset(n: Int): BottomK = copy(mutableAggBufferOffset = n)
  override def withNewInputAggBufferOffset(n: Int): BottomK = copy(inputAggBufferOffset = n)
  override protected def withNewChildrenInternal(c: IndexedSeq[Expression]): BottomK =
    copy(salt = c(0), pid = c(1), label = c(2), cnt = c(3), value = c(4))

  override def createAggregationBuffer(): KeyHeap = new KeyHeap(k)

  @transient private lazy val sha = MessageDigest.getInstance("SHA-256")
  private val SEP: Array[Byte] = Array(0x1f.toByte)
  private val COLON: Array[Byte] = ":".getBytes(StandardCharsets.UTF_8)

  private def copyValue(v: Any): Any = InternalRow.copyValue(v)

  override def update(heap: KeyHeap, input: InternalRow): KeyHeap = {
    val s = salt.eval(input)
    val p = pid.eval(input)
    val l = label.eval(input)
    val c = cnt.eval(input)
    if (s == null || p == null || l == null || c == null) return heap
    val n = c match { case x: Long => x; case x: Int => x.toLong }
    if (n <= 0) return heap
    val v = value.eval(input)
    val md = sha
    val sb = s.asInstanceOf[org.apache.spark.unsafe.types.UTF8String].getBytes
    val pb = p.asInstanceOf[org.apache.spark.unsafe.types.UTF8String].getBytes
    val lb = l.asInstanceOf[org.apache.spark.unsafe.types.UTF8String].getBytes
    var stored: Any = null
    var j = 0L
    while (j < n) {
      val d = md
      d.reset()
      d.update(sb); d.update(pb); d.update(SEP); d.update(lb); d.update(COLON)
      d.update(java.lang.Long.toString(j).getBytes(StandardCharsets.US_ASCII))
      val h = d.digest()
      var w0 = 0L
      var i = 0
      while (i < 8) { w0 = (w0 << 8) | (h(i) & 0xffL); i += 1 }
      var w1 = 0L
      while (i < 15) { w1 = (w1 << 8) | (h(i) & 0xffL); i += 1 }
      val a = w0 >>> 4
      val b = ((w0 & 0xfL) << 56) | w1
      if (heap.admits(a, b)) {
        if (stored == null) stored = copyValue(v)
        heap.offer(a, b, stored) // copies are identical: one stored value serves all of them
      }
      j += 1
    }
    heap
  }

  override def merge(heap: KeyHeap, other: KeyHeap): KeyHeap = {
    var i = 0
    while (i < other.size) { heap.offer(other.k1(i), other.k2(i), other.values(i)); i += 1 }
    heap
  }

  override def eval(heap: KeyHeap): Any = new GenericArrayData(heap.sortedIndices.map(i => heap.values(i)))

  // serialisation: count, then per entry k1, k2 and the value as an UnsafeRow of one field
  @transient private lazy val valueProjection = UnsafeProjection.create(Array[DataType](value.dataType))
  @transient private lazy val entryRow = new GenericInternalRow(1)

  override def serialize(heap: KeyHeap): Array[Byte] = {
    val bytes = new ByteArrayOutputStream()
    val out = new DataOutputStream(bytes)
    out.writeInt(heap.size)
    var i = 0
    while (i < heap.size) {
      out.writeLong(heap.k1(i)); out.writeLong(heap.k2(i))
      entryRow.update(0, heap.values(i))
      val row = valueProjection(entryRow)
      out.writeInt(row.getSizeInBytes)
      out.write(row.getBytes)
      i += 1
    }
    out.flush()
    bytes.toByteArray
  }

  override def deserialize(bytes: Array[Byte]): KeyHeap = {
    val in = new DataInputStream(new ByteArrayInputStream(bytes))
    val heap = new KeyHeap(k)
    val n = in.readInt()
    var i = 0
    while (i < n) {
      val a = in.readLong()
      val b = in.readLong()
      val len = in.readInt()
      val buf = new Array[Byte](len)
      in.readFully(buf)
      val row = new UnsafeRow(1)
      row.pointTo(buf, len)
      heap.offer(a, b, copyValue(row.get(0, value.dataType)))
      i += 1
    }
    heap
  }
}
