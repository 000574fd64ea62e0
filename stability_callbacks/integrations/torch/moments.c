/* The CPU moment pass in one read (stability_callbacks/integrations/torch/native.py builds it
 * with the machine's C compiler at first use, -fopenmp, and loads it with ctypes).
 *
 * For each item (a contiguous run of one optimizer-state tensor): the sum and the max of v
 * (Adam's exp_avg_sq, >= 0) and, when m (exp_avg) is given, the sum of squares of m. Blocks of
 * 256 elements are summed in 32 fp32 lanes (8 elements each), folded to 8, and added into 8
 * float64 lanes, in one fixed order: the result does not depend on which thread runs which item.
 * A block's max is read again (from L1) only when it can hold a larger element than found so
 * far (see MOMENTS). The max starts at 0 (v >= 0) and a NaN never wins it; a NaN anywhere makes
 * the sum NaN, and the caller then reports NaN for the max too.
 *
 * GCC/Clang vector extensions: SIMD on any target (AVX2 when built with -mavx2, SSE2 or NEON
 * otherwise); a few AVX intrinsics where the generic form compiles badly. No allocation.
 */
#include <stdint.h>
#include <string.h>

typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));
typedef uint32_t u8 __attribute__((vector_size(32)));
typedef uint16_t h8 __attribute__((vector_size(16)));
typedef float f4 __attribute__((vector_size(16)));
typedef double d4 __attribute__((vector_size(32)));

#define BLOCK 256

static inline f8 load_f32(const float *p) { f8 x; memcpy(&x, p, sizeof x); return x; }
static inline f8 load_bf16(const uint16_t *p) {   /* bf16 is the top half of an fp32 */
    h8 h; memcpy(&h, p, sizeof h);
    u8 u = __builtin_convertvector(h, u8) << 16;
    f8 x; memcpy(&x, &u, sizeof x); return x;
}
static inline float one_f32(const float *p) { return *p; }
static inline float one_bf16(const uint16_t *p) {
    uint32_t u = (uint32_t)*p << 16; float f; memcpy(&f, &u, sizeof f); return f;
}
/* a > b ? a : b per lane: a NaN in a never wins (MAXPS's own rule) */
#if defined(__AVX__)
#include <immintrin.h>
static inline f8 vmax(f8 a, f8 b) { return (f8)_mm256_max_ps((__m256)a, (__m256)b); }
#else
static inline f8 vmax(f8 a, f8 b) { i8 gt = a > b; return (f8)(((i8)a & gt) | ((i8)b & ~gt)); }
#endif
/* a block's fp32 lanes into the float64 lanes */
static inline d4 widen_add(d4 acc, f8 a, int half) {
#if defined(__AVX__)
    __m128 h = half ? _mm256_extractf128_ps((__m256)a, 1) : _mm256_castps256_ps128((__m256)a);
    return acc + (d4)_mm256_cvtps_pd(h);
#else
    f4 h; memcpy(&h, (const char *)&a + 16 * half, sizeof h);
    return acc + __builtin_convertvector(h, d4);
#endif
}
static inline double dsum(d4 a, d4 b) { d4 c = a + b; return (c[0] + c[1]) + (c[2] + c[3]); }

static inline int any_at_least(f8 a0, f8 a1, f8 a2, f8 a3, f8 b) {
    i8 ge = (a0 >= b) | (a1 >= b) | (a2 >= b) | (a3 >= b);
#if defined(__AVX__)
    return _mm256_movemask_ps((__m256)ge) != 0;
#else
    return (ge[0] | ge[1] | ge[2] | ge[3] | ge[4] | ge[5] | ge[6] | ge[7]) != 0;
#endif
}
static inline float hmax(f8 a) { float t = a[0]; for (int l = 1; l < 8; l++) t = a[l] > t ? a[l] : t; return t; }

/* n items: vp[i] / mp[i] (mp may be NULL) point at len[i] elements; out: sum_v[i], sq_m[i] (when
 * mp), max_v[i]. A block's max is read (from L1: the block was just summed) only when one of its
 * lane sums reaches the largest element found so far: a sum of non-negative floats is never
 * below any of its terms, also in fp32 (rounding is monotone), so the other blocks cannot hold
 * a larger element. */
#define MOMENTS(NAME, T, LOAD, ONE)                                                               \
/* the block read again, from L1; not inlined, so that the compiler does not keep the first */   \
/* read's 32 vectors for it (it did: on the stack, every block) */                               \
__attribute__((noinline)) static float NAME##_block_max(const T *v, f8 top) {                    \
    f8 mx0 = top, mx1 = top;                                                                     \
    for (int j = 0; j < BLOCK; j += 16) { mx0 = vmax(LOAD(v + j), mx0); mx1 = vmax(LOAD(v + j + 8), mx1); } \
    return hmax(vmax(mx0, mx1));                                                                 \
}                                                                                                \
static void NAME(int64_t n, const int64_t *vp, const int64_t *mp, const int64_t *len,            \
          double *sum_v, double *sq_m, float *max_v) {                                           \
    for (int64_t it = 0; it < n; it++) {                                                         \
        const T *v = (const T *)(intptr_t)vp[it];                                                \
        const T *m = mp ? (const T *)(intptr_t)mp[it] : 0;                                       \
        int64_t k = len[it], i = 0;                                                              \
        float top = 0.0f;                                                                        \
        f8 topv = {0};                                                                           \
        d4 v0 = {0}, v1 = {0}, m0 = {0}, m1 = {0};                                               \
        for (; i + BLOCK <= k; i += BLOCK) {                                                     \
            f8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};                                           \
            for (int j = 0; j < BLOCK; j += 32) {                                                \
                a0 += LOAD(v + i + j); a1 += LOAD(v + i + j + 8);                                \
                a2 += LOAD(v + i + j + 16); a3 += LOAD(v + i + j + 24);                          \
            }                                                                                    \
            f8 a = (a0 + a1) + (a2 + a3);                                                        \
            v0 = widen_add(v0, a, 0); v1 = widen_add(v1, a, 1);                                  \
            if (any_at_least(a0, a1, a2, a3, topv)) {                                            \
                top = NAME##_block_max(v + i, topv);                                             \
                topv = top - (f8){0};                                                            \
            }                                                                                    \
            if (m) {                                                                             \
                f8 b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};                                       \
                for (int j = 0; j < BLOCK; j += 32) {                                            \
                    f8 y0 = LOAD(m + i + j), y1 = LOAD(m + i + j + 8);                           \
                    f8 y2 = LOAD(m + i + j + 16), y3 = LOAD(m + i + j + 24);                     \
                    b0 += y0 * y0; b1 += y1 * y1; b2 += y2 * y2; b3 += y3 * y3;                  \
                }                                                                                \
                f8 b = (b0 + b1) + (b2 + b3);                                                    \
                m0 = widen_add(m0, b, 0); m1 = widen_add(m1, b, 1);                              \
            }                                                                                    \
        }                                                                                        \
        double sv = dsum(v0, v1), sm = dsum(m0, m1);                                             \
        for (; i < k; i++) {   /* the tail, under a block */                                     \
            float x = ONE(v + i);                                                                \
            sv += x;                                                                             \
            top = x > top ? x : top;                                                             \
            if (m) { double y = ONE(m + i); sm += y * y; }                                       \
        }                                                                                        \
        sum_v[it] = sv;                                                                          \
        if (m) sq_m[it] = sm;                                                                    \
        max_v[it] = top;                                                                         \
    }                                                                                            \
}

MOMENTS(moments_f32, float, load_f32, one_f32)
MOMENTS(moments_bf16, uint16_t, load_bf16, one_bf16)

/* All work units in one parallel region of the OpenMP runtime torch already runs (native.py
 * builds this only where that runtime is libgomp, which this links): torch's own threads, still
 * spinning after its last kernel, take the units as they come, and a descheduled thread holds
 * back one unit. unit[u]..unit[u+1] are the items of unit u; order: the units, largest first. */
#define ALL(NAME, T)                                                                              \
void NAME##_all(int64_t units, const int64_t *unit, const int64_t *order, int threads,           \
                const int64_t *vp, const int64_t *mp, const int64_t *len,                        \
                double *sum_v, double *sq_m, float *max_v) {                                     \
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(threads)")                        \
    for (int64_t k = 0; k < units; k++) {                                                        \
        int64_t a = unit[order[k]], b = unit[order[k] + 1];                                      \
        NAME(b - a, vp + a, mp ? mp + a : 0, len + a, sum_v + a, sq_m + a, max_v + a);           \
    }                                                                                            \
}
ALL(moments_f32, float)
ALL(moments_bf16, uint16_t)
