"""A runtime-trip-count loop over strided pointers: ``disable-lsr`` (code generation) and
``unroll-count`` (the -O3 IR pipeline) each visibly change its PTX. Used by the pipeline tests and
``scripts/benchmarks/compile_overhead.py``."""
import triton
import triton.language as tl


@triton.jit
def strided_sum(X, Y, N, stride, BLOCK: tl.constexpr):
    """``Y[:BLOCK] = sum_i X[i*stride : i*stride + BLOCK]`` for ``i < N``."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, N):
        acc += tl.load(X + i * stride + offs)
    tl.store(Y + offs, acc)
