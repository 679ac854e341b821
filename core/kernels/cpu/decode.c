/* One decode step of one request, every layer and the LM head, in float32 on an x86-64 CPU with AVX2 and FMA.
 *
 * Why it exists: at one row a decode step is a chain of matrix-vector products over every weight (bandwidth
 * bound) with a few small vector ops between them. Through torch that is about 3,850 op calls for a 30-layer
 * model, and each one-row product reaches well under the memory's bandwidth. Here the whole step is one call
 * and one OpenMP parallel region: both threads stream contiguous blocks of every weight's rows, and the small
 * work between the products (norms, RoPE, the KV write, attention over the request's cached tokens) runs
 * between barriers. The sums run in another order than torch's, so the results are close, not identical.
 *
 * A decoder linear's weight is float32, or int8 with a float32 scale per output row (--precision int8: a quarter
 * of the bytes to stream; each row's sum runs over the int8 values widened to float32 and is scaled once at the
 * end), or with integer dot products (the Shape's int_dots): each product's input quantised to int8 with a
 * float32 scale per block of 32 values, int8 x int8 products summed exactly in int32 per block, scaled by the
 * block's scale, and the row's sum scaled once at the end; those int8 weights are tiled (tile_int8: eight rows
 * interleaved block by block, one stream per pass). Under int8 the LM head is int8 the same way (an int8 copy of
 * the tied embedding table: the row lookup keeps reading the float32 table).
 *
 * Layouts are the engine's own: a weight is [out, in] row-major (torch's Linear), the fused QKV projection's
 * rows are q then k then v, gate_up's are gate then up, the KV pool of a layer is [slots, kv_heads, head_dim],
 * the RoPE table row of a position is cos of each frequency then its sin (rotate-half pairing i, i + dim/2).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exp8.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* A linear's weight: float32 [out, in] when scales is NULL, else int8 [out, in] with scales [out] (under integer
 * dot products in tile_int8's layout). A float32 weight made of 4-bit codes (a Q4_1 GGUF's linears, dequantised)
 * may come as q4 instead (values unused): each row's blocks of Q4_BLOCK inputs as Q4_ROW_BYTES bytes, byte j
 * holding input j's code in its low nibble and input j + 16's in its high one, then the block's d and m (float32);
 * every weight is fma(code, d, m), the float the float32 weight holds, so the step's sums are the same floats from
 * a fifth of the bytes. */
typedef struct {
    const void *values;
    const float *scales;
    const uint8_t *q4;
} Weight;

#define Q4_BLOCK 32
#define Q4_ROW_BYTES (Q4_BLOCK / 2 + 8)

typedef struct {
    const float *input_norm, *qkv_bias, *q_norm, *k_norm; /* qkv_bias, q_norm, k_norm may be NULL */
    Weight qkv, o_proj, gate_up, down;
    const float *post_norm;
    float *k_cache, *v_cache; /* this layer's [slots, kv_heads, head_dim] */
} Layer;

typedef struct {
    int32_t hidden, intermediate, heads, kv_heads, head_dim, layers, vocab, threads;
    int32_t int_dots; /* int8 weights: quantise each product's input to int8, integer dot products */
    float eps, qk_eps, scale;
} Shape;

typedef struct {
    const int64_t *token;     /* the input token id */
    const int64_t *position;  /* its position */
    const int64_t *slots;     /* the request's KV slots of positions [0, len) */
    int64_t len;              /* tokens attended over, the new one included (its slot is slots[len - 1]) */
    const float *embedding;   /* [vocab, hidden] */
    const float *final_norm;  /* [hidden] */
    Weight lm_head;           /* [vocab, hidden], float32 or int8 */
    const float *rope;        /* [positions, head_dim]: cos then sin */
    float *logits;            /* [vocab] out */
    float *scratch;           /* scratch_floats(shape, max_len) floats, len <= max_len */
    /* A greedy step of a float32 LM head may screen its rows through an int8 copy (tile_int8's layout, a scale
     * per row; values NULL: no screen) and each float32 row's sum of magnitudes: see screened_logits. */
    Weight screen;
    const float *screen_l1;   /* [vocab, blocks of QBLOCK inputs]: each row's sum of magnitudes per block */
    float *screen_bounds;     /* [vocab]: the screen's bound per row */
    float *screen_tops;       /* [threads]: what the threads share of the screen */
} Step;

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* a . b; with `ahead` > 0, a is a weight row whose stream is prefetched that many bytes ahead (past the row's end
 * that is the next row: a thread's rows lie one after another). It helps where the hardware prefetcher lags the
 * stream and costs nothing where it does not (docs/BENCHMARKS.md). */
#define STREAM_AHEAD 2048
/* A second prefetch of every weight stream, FAR_AHEAD bytes ahead into L2 (T1): the near one (T0, 2 KB) alone left
 * the stream bound by memory latency; 16 KB ahead beat 8 and 32 (docs/BENCHMARKS.md). */
#define FAR_AHEAD 16384
static inline float dot_ahead(const float *a, const float *b, int n, int ahead) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        if (ahead) {
            _mm_prefetch((const char *)(a + k) + ahead, _MM_HINT_T0);
            _mm_prefetch((const char *)(a + k) + FAR_AHEAD, _MM_HINT_T1);
        }
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), acc1);
    }
    for (; k + 8 <= n; k += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
    float sum = hsum(_mm256_add_ps(acc0, acc1));
    for (; k < n; k++) sum += a[k] * b[k];
    return sum;
}

static inline float dot(const float *a, const float *b, int n) { return dot_ahead(a, b, n, 0); }

/* dot_ahead's sum for a row of 4-bit codes (n a multiple of Q4_BLOCK): its weights expanded eight at a time and
 * multiplied in dot_ahead's order (inputs k..k+7 into one accumulator, k+8..k+15 into the other), so the same
 * float. */
static inline float dot_q4(const uint8_t *row, const float *x, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi32(15);
    for (int k = 0; k < n; k += Q4_BLOCK) {
        const uint8_t *block = row + k / Q4_BLOCK * Q4_ROW_BYTES;
        _mm_prefetch((const char *)block + STREAM_AHEAD / 4, _MM_HINT_T0);
        _mm_prefetch((const char *)block + FAR_AHEAD / 4, _MM_HINT_T1);
        __m128i codes = _mm_loadu_si128((const __m128i *)block);
        float dm[2];
        memcpy(dm, block + Q4_BLOCK / 2, sizeof dm);
        __m256 d = _mm256_set1_ps(dm[0]), m = _mm256_set1_ps(dm[1]);
        __m256i c0 = _mm256_cvtepu8_epi32(codes), c1 = _mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8));
        __m256 w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(c0, low)), d, m);
        __m256 w1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(c1, low)), d, m);
        __m256 w2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c0, 4)), d, m);
        __m256 w3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c1, 4)), d, m);
        acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + k), acc0);
        acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + k + 8), acc1);
        acc0 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + k + 16), acc0);
        acc1 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + k + 24), acc1);
    }
    return hsum(_mm256_add_ps(acc0, acc1));
}

/* The same sum with AVX-512: lanes 0-7 of one accumulator are dot_q4's acc0, lanes 8-15 its acc1, each lane fed the
 * same products in the same order, and the halves added before the same horizontal sum; sixteen weights are
 * expanded at a time, half the instructions. */
__attribute__((target("avx512f,fma"))) static float dot_q4_wide(const uint8_t *row, const float *x, int n) {
    __m512 acc = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi32(15);
    for (int k = 0; k < n; k += Q4_BLOCK) {
        const uint8_t *block = row + k / Q4_BLOCK * Q4_ROW_BYTES;
        _mm_prefetch((const char *)block + STREAM_AHEAD / 4, _MM_HINT_T0);
        _mm_prefetch((const char *)block + FAR_AHEAD / 4, _MM_HINT_T1);
        float dm[2];
        memcpy(dm, block + Q4_BLOCK / 2, sizeof dm);
        __m512 d = _mm512_set1_ps(dm[0]), m = _mm512_set1_ps(dm[1]);
        __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)block));
        __m512 w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(c, low)), d, m);
        __m512 w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(c, 4)), d, m);
        acc = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + k), acc);
        acc = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + k + 16), acc);
    }
    __m256 lo = _mm512_castps512_ps256(acc);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
    return hsum(_mm256_add_ps(lo, hi));
}

/* Whether this CPU has AVX-512F, asked once (the answer is the same for every thread that races to it). */
static int has_avx512(void) {
    static int known = -1;
    if (known < 0) known = __builtin_cpu_supports("avx512f") ? 1 : 0;
    return known;
}

/* Eight int8 weights widened to float32. */
static inline __m256 widen8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* Four int8 rows against one vector, each weight load widened: the vector's loads are shared, and four weight
 * streams keep the memory busy; the caller applies the rows' scales. */
static inline void dot4_int8(const int8_t *w, int64_t stride, const float *x, int n, float out[4]) {
    const int8_t *r0 = w, *r1 = w + stride, *r2 = w + 2 * stride, *r3 = w + 3 * stride;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 xv = _mm256_loadu_ps(x + k);
        a0 = _mm256_fmadd_ps(widen8(r0 + k), xv, a0);
        a1 = _mm256_fmadd_ps(widen8(r1 + k), xv, a1);
        a2 = _mm256_fmadd_ps(widen8(r2 + k), xv, a2);
        a3 = _mm256_fmadd_ps(widen8(r3 + k), xv, a3);
    }
    out[0] = hsum(a0); out[1] = hsum(a1); out[2] = hsum(a2); out[3] = hsum(a3);
    for (; k < n; k++) {
        out[0] += r0[k] * x[k]; out[1] += r1[k] * x[k]; out[2] += r2[k] * x[k]; out[3] += r3[k] * x[k];
    }
}

#define QBLOCK 32 /* integer dot products: a product's input is quantised in blocks of 32, a scale for each */

/* A product's input: float32, and under integer dot products also its int8 copy with a float32 scale per block
 * of QBLOCK values (x ~ q * scales[k / QBLOCK]); q is NULL where the products run on float32 inputs. */
typedef struct {
    const float *x;
    const int8_t *q;
    const float *scales;
} Input;

static inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* Block by block: q = round(x / scale) with scale = max|x| / 127 over the block (symmetric); so each value is
 * within half its block's scale, and an outlier costs only its own block's precision. */
void quantize_input(const float *x, int n, int8_t *q, float *scales) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    /* packs interleave the 128-bit lanes; this puts the 4-value groups back in order */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int k = 0;
    for (; k + QBLOCK <= n; k += QBLOCK) {
        __m256 v0 = _mm256_loadu_ps(x + k), v1 = _mm256_loadu_ps(x + k + 8);
        __m256 v2 = _mm256_loadu_ps(x + k + 16), v3 = _mm256_loadu_ps(x + k + 24);
        __m256 top = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                   _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        float amax = hmax(top);
        scales[k / QBLOCK] = amax / 127.0f;
        __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(v0, inv)), b = _mm256_cvtps_epi32(_mm256_mul_ps(v1, inv));
        __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(v2, inv)), d = _mm256_cvtps_epi32(_mm256_mul_ps(v3, inv));
        __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
        _mm256_storeu_si256((__m256i *)(q + k), _mm256_permutevar8x32_epi32(packed, order));
    }
    if (k < n) { /* a last, shorter block */
        float amax = 0.0f;
        for (int j = k; j < n; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        scales[k / QBLOCK] = amax / 127.0f;
        float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int j = k; j < n; j++) q[j] = (int8_t)nearbyintf(x[j] * inv);
    }
}

/* 32 products of int8 row values and int8 inputs, summed in pairs into 16 int16 and those in pairs into 8 int32.
 * maddubs multiplies unsigned by signed bytes: |x| against w with x's sign moved onto it. Each int16 is two
 * products of at most 127 * 127, 32,258 < 32,767: no saturation (quantize_input never makes -128). */
static inline __m256i dot32_q8(__m256i abs_x, __m256i x, const int8_t *w) {
    __m256i w_signed = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)w), x);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_x, w_signed), _mm256_set1_epi16(1));
}

/* Under integer dot products an int8 weight is tiled (tile_int8): TILE rows at a time, interleaved block by
 * block, so a pass over TILE rows reads one contiguous stream (row-major, it read TILE streams a row apart, which
 * the hardware prefetcher follows poorly), and each block
 * of the quantised input is loaded once for TILE rows. Its parts, in order: the tiles ([tiles][blocks][TILE][QBLOCK]),
 * then the tiled rows' last n % QBLOCK values ([tiles * TILE][tail]), then the rows left over from the tiles,
 * row-major ([rows % TILE][n]); the same bytes as the row-major weight. */
#define TILE 8
/* Bytes ahead on a tile's stream (eight blocks of the tile), fetched into every cache level (T0). Non-temporal
 * (NTA) gained a little on one CPU but halved the speed on another, whose L2 streamer does not follow NTA
 * prefetches (docs/BENCHMARKS.md), so T0 everywhere. */
#define PREFETCH_AHEAD 2048

typedef struct {
    int64_t tiles, blocks, tail;
    const int8_t *tiled, *tails, *rest;
} Tiling;

static inline Tiling tiling(const int8_t *values, int64_t rows, int n) {
    Tiling t;
    t.tiles = rows / TILE;
    t.blocks = n / QBLOCK;
    t.tail = n % QBLOCK;
    t.tiled = values;
    t.tails = values + t.tiles * TILE * t.blocks * QBLOCK;
    t.rest = t.tails + t.tiles * TILE * t.tail;
    return t;
}

/* out = values [rows, n] (row-major) in the tiled layout above. */
void tile_int8(const int8_t *values, int64_t rows, int n, int8_t *out) {
    Tiling t = tiling(out, rows, n);
    for (int64_t r = 0; r < t.tiles * TILE; r++) {
        const int8_t *src = values + r * n;
        int64_t tile = r / TILE, i = r % TILE;
        for (int64_t b = 0; b < t.blocks; b++)
            memcpy(out + ((tile * t.blocks + b) * TILE + i) * QBLOCK, src + b * QBLOCK, QBLOCK);
        memcpy(out + (t.tails - t.tiled) + r * t.tail, src + t.blocks * QBLOCK, t.tail);
    }
    memcpy(out + (t.rest - t.tiled), values + t.tiles * TILE * n, (size_t)(rows - t.tiles * TILE) * n);
}

/* The TILE rows of one tile against the int8 input: each block's int32 sums (exact) times the block's scale,
 * added up in float32 lane by lane, then across the lanes, then the tail; the caller applies the rows' scales. */
static inline void tile_q8(const Tiling *t, int64_t tile, Input in, float out[TILE]) {
    const int8_t *w = t->tiled + tile * t->blocks * TILE * QBLOCK, *x = in.q;
    __m256 acc[TILE];
    for (int i = 0; i < TILE; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < t->blocks; b++, w += TILE * QBLOCK) {
        for (int line = 0; line < TILE * QBLOCK; line += 64) {
            _mm_prefetch((const char *)(w + PREFETCH_AHEAD + line), _MM_HINT_T0);
            _mm_prefetch((const char *)(w + FAR_AHEAD + line), _MM_HINT_T1);
        }
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x + b * QBLOCK)), ax = _mm256_abs_epi8(xv);
        __m256 scale = _mm256_set1_ps(in.scales[b]);
        for (int i = 0; i < TILE; i++)
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32_q8(ax, xv, w + i * QBLOCK)), scale, acc[i]);
    }
    for (int i = 0; i < TILE; i++) out[i] = hsum(acc[i]);
    if (t->tail) {
        const int8_t *tails = t->tails + tile * TILE * t->tail, *xt = x + t->blocks * QBLOCK;
        for (int i = 0; i < TILE; i++) {
            int32_t sum = 0;
            for (int j = 0; j < t->tail; j++) sum += tails[i * t->tail + j] * xt[j];
            out[i] += (float)sum * in.scales[t->blocks];
        }
    }
}

/* One int8 row against the int8 input, block by block (the rows left over from the blocks of four). */
static inline float row1_q8(const int8_t *r, Input in, int n) {
    float sum = 0.0f;
    for (int k = 0; k < n; k += QBLOCK) {
        int32_t t = 0;
        for (int j = k; j < n && j < k + QBLOCK; j++) t += r[j] * in.q[j];
        sum += (float)t * in.scales[k / QBLOCK];
    }
    return sum;
}

/* Row r of a tiled weight against the int8 input, block by block (a row outside a whole tile of a pass). */
static inline float row_tiled_q8(const Tiling *t, int64_t r, Input in, int n) {
    if (r >= t->tiles * TILE) return row1_q8(t->rest + (r - t->tiles * TILE) * n, in, n);
    const int8_t *w = t->tiled + ((r / TILE) * t->blocks * TILE + r % TILE) * QBLOCK;
    float sum = 0.0f;
    for (int64_t b = 0; b < t->blocks; b++) {
        int32_t s = 0;
        for (int j = 0; j < QBLOCK; j++) s += w[b * TILE * QBLOCK + j] * in.q[b * QBLOCK + j];
        sum += (float)s * in.scales[b];
    }
    if (t->tail) {
        int32_t s = 0;
        for (int j = 0; j < t->tail; j++) s += t->tails[r * t->tail + j] * in.q[t->blocks * QBLOCK + j];
        sum += (float)s * in.scales[t->blocks];
    }
    return sum;
}

/* Rows [row, row + 4) of an int8 weight against the float32 input, scaled (integer dot products go through the
 * tiles instead). */
static inline void rows4_int8(Weight w, int64_t row, Input in, int n, float out[4]) {
    dot4_int8((const int8_t *)w.values + row * n, n, in.x, n, out);
    for (int i = 0; i < 4; i++) out[i] *= w.scales[row + i];
}

/* One row of either weight type against the input: every row of a float32 weight, an int8 weight's rows left over
 * from the blocks of four. */
static inline float row1(Weight w, int64_t row, Input in, int n) {
    if (w.q4) {
        const uint8_t *codes = w.q4 + row * (n / Q4_BLOCK) * Q4_ROW_BYTES;
        return has_avx512() ? dot_q4_wide(codes, in.x, n) : dot_q4(codes, in.x, n);
    }
    if (!w.scales) return dot_ahead((const float *)w.values + row * n, in.x, n, STREAM_AHEAD);
    const int8_t *r = (const int8_t *)w.values + row * n;
    float sum = 0.0f;
    for (int k = 0; k < n; k++) sum += r[k] * in.x[k];
    return sum * w.scales[row];
}

/* This thread's share of rows [0, rows): contiguous blocks of `unit` rows (four, or a tile), so each thread
 * streams one stretch of the weight. */
static inline void share(int64_t rows, int64_t unit, int64_t *begin, int64_t *end) {
#ifdef _OPENMP
    int n = omp_get_num_threads(), t = omp_get_thread_num();
#else
    int n = 1, t = 0;
#endif
    int64_t blocks = (rows + unit - 1) / unit, per = blocks / n, extra = blocks % n;
    int64_t first = t * per + (t < extra ? t : extra);
    int64_t count = per + (t < extra ? 1 : 0);
    *begin = first * unit;
    *end = (first + count) * unit < rows ? (first + count) * unit : rows;
}

/* The tiled weight's rows against the int8 input, this thread's tiles (its last rows, left over, one by one). */
static void gemv_tiled(Weight w, Input x, int64_t rows, int n, const float *add, float *y) {
    Tiling t = tiling((const int8_t *)w.values, rows, n);
    int64_t begin, end;
    share(rows, TILE, &begin, &end);
    int64_t r = begin;
    float out[TILE];
    for (; r + TILE <= end; r += TILE) {
        tile_q8(&t, r / TILE, x, out);
        for (int i = 0; i < TILE; i++) y[r + i] = out[i] * w.scales[r + i] + (add ? add[r + i] : 0.0f);
    }
    for (; r < end; r++) y[r] = row_tiled_q8(&t, r, x, n) * w.scales[r] + (add ? add[r] : 0.0f);
}

/* y[r] = W[r] . x (+ add[r]) for this thread's rows; add may alias y (the residual stream). A float32 weight's rows
 * go one by one, so each thread reads its stretch of the weight in address order, one stream the hardware
 * prefetcher follows from row to row; four rows at a time (four streams a row apart, each as short as a row)
 * break the streams into pieces too short for the prefetcher and ran much slower. */
static void gemv_rows(Weight w, Input x, int64_t rows, int n, const float *add, float *y) {
    if (w.scales && x.q) {
        gemv_tiled(w, x, rows, n, add, y);
        return;
    }
    int64_t begin, end;
    share(rows, 4, &begin, &end);
    int64_t r = begin;
    float out[4];
    for (; w.scales && r + 4 <= end; r += 4) {
        rows4_int8(w, r, x, n, out);
        for (int i = 0; i < 4; i++) y[r + i] = out[i] + (add ? add[r + i] : 0.0f);
    }
    for (; r < end; r++) y[r] = row1(w, r, x, n) + (add ? add[r] : 0.0f);
}

/* act[i] = silu(gate[i]) * up[i] with gate and up computed here: row i of the gate block and of the up block. */
static inline float silu_times(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

/* The same over a tiled weight: tile by tile where the up rows' tiles line up with the gate rows' (intermediate
 * a multiple of TILE), else row by row. */
static void gate_up_tiled(Weight w, Input x, int64_t inter, int n, float *act) {
    Tiling t = tiling((const int8_t *)w.values, 2 * inter, n);
    int64_t begin, end;
    share(inter, TILE, &begin, &end);
    float g[TILE], u[TILE];
    int64_t i = begin;
    if (inter % TILE == 0) {
        for (; i + TILE <= end; i += TILE) {
            tile_q8(&t, i / TILE, x, g);
            tile_q8(&t, (inter + i) / TILE, x, u);
            for (int j = 0; j < TILE; j++)
                act[i + j] = silu_times(g[j] * w.scales[i + j], u[j] * w.scales[inter + i + j]);
        }
    }
    for (; i < end; i++) {
        float gate = row_tiled_q8(&t, i, x, n) * w.scales[i];
        float up = row_tiled_q8(&t, inter + i, x, n) * w.scales[inter + i];
        act[i] = silu_times(gate, up);
    }
}

static void gate_up_rows(Weight w, Input x, int64_t inter, int n, float *act) {
    if (w.scales && x.q) {
        gate_up_tiled(w, x, inter, n, act);
        return;
    }
    int64_t begin, end;
    share(inter, 4, &begin, &end);
    if (!w.scales) { /* float32: this thread's gate rows, then its up rows, each one stream (see gemv_rows) */
        for (int64_t i = begin; i < end; i++) act[i] = row1(w, i, x, n);
        for (int64_t i = begin; i < end; i++) act[i] = silu_times(act[i], row1(w, inter + i, x, n));
        return;
    }
    float g[4], u[4];
    int64_t i = begin;
    for (; i + 4 <= end; i += 4) {
        rows4_int8(w, i, x, n, g);
        rows4_int8(w, inter + i, x, n, u);
        for (int j = 0; j < 4; j++) act[i + j] = silu_times(g[j], u[j]);
    }
    for (; i < end; i++) {
        act[i] = silu_times(row1(w, i, x, n), row1(w, inter + i, x, n));
    }
}

/* out += p * v */
static inline void axpy(float *restrict out, float p, const float *restrict v, int n) {
    __m256 pv = _mm256_set1_ps(p);
    int k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(out + k, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + k), _mm256_loadu_ps(out + k)));
    for (; k < n; k++) out[k] += p * v[k];
}

static void rms_norm(const float *x, const float *weight, int n, float eps, float *out) {
    float sum = 0.0f;
    for (int k = 0; k < n; k++) sum += x[k] * x[k];
    float inv = 1.0f / sqrtf(sum / (float)n + eps);
    for (int k = 0; k < n; k++) out[k] = x[k] * inv * weight[k];
}

static void rotate(float *x, const float *cos_sin, int dim) {
    int half = dim / 2;
    const float *cos = cos_sin, *sin = cos_sin + half;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i] + a * sin[i];
    }
}

/* Attention is split over the cached tokens, not the heads (a model has few KV heads, and threads would idle):
 * each thread attends every head over its stretch of tokens, reading each key and value row once for all the
 * query heads that share it, and keeps its running maximum, softmax sum and weighted values; a merge then
 * rescales the parts to one maximum. Partial results per thread: [heads] max, [heads] sum, [heads, dim] values. */
static void attend_part(const Shape *s, const float *q, const float *k_cache, const float *v_cache,
                        const int64_t *slots, int64_t len, float *scores, float *part) {
    int dim = s->head_dim, heads = s->heads, group = s->heads / s->kv_heads;
    int64_t row = (int64_t)s->kv_heads * dim;
    int64_t begin, end;
    share(len, 4, &begin, &end);
    float *top = part, *total = part + heads, *acc = part + 2 * heads;
    for (int head = 0; head < heads; head++) { top[head] = -INFINITY; total[head] = 0.0f; }
    for (int64_t i = 0; i < (int64_t)heads * dim; i++) acc[i] = 0.0f;
    /* token by token: a slot's keys (and values) of every KV head are one contiguous row, read once */
    for (int64_t t = begin; t < end; t++) {
        const float *k = k_cache + slots[t] * row;
        for (int head = 0; head < heads; head++) {
            float score = dot(q + head * dim, k + (head / group) * dim, dim) * s->scale;
            scores[head * len + t] = score;
            top[head] = score > top[head] ? score : top[head];
        }
    }
    for (int64_t t = begin; t < end; t++) {
        const float *v = v_cache + slots[t] * row;
        for (int head = 0; head < heads; head++) {
            float p = expf(scores[head * len + t] - top[head]);
            total[head] += p;
            axpy(acc + head * dim, p, v + (head / group) * dim, dim);
        }
    }
}

/* out[head] = the parts' values rescaled to their common maximum, over their rescaled sums. */
static void merge_parts(const Shape *s, const float *parts, int nparts, float *out) {
    int dim = s->head_dim, heads = s->heads;
    int64_t stride = (int64_t)heads * (dim + 2);
    for (int head = 0; head < heads; head++) {
        float top = -INFINITY, total = 0.0f;
        for (int i = 0; i < nparts; i++) {
            float m = parts[i * stride + head];
            top = m > top ? m : top;
        }
        float *o = out + head * dim;
        for (int d = 0; d < dim; d++) o[d] = 0.0f;
        for (int i = 0; i < nparts; i++) {
            const float *part = parts + i * stride;
            if (part[heads + head] == 0.0f) continue; /* a thread with no tokens */
            float w = expf(part[head] - top);
            total += w * part[heads + head];
            const float *acc = part + 2 * heads + head * dim;
            for (int d = 0; d < dim; d++) o[d] += w * acc[d];
        }
        for (int d = 0; d < dim; d++) o[d] /= total;
    }
}

/* Where the step's buffers lie in the scratch: shared ones, then each thread's own. */
typedef struct {
    float *x;      /* [hidden] the residual stream */
    float *qkv;    /* [q + k + v] the QKV projection's output */
    float *act;    /* [intermediate] silu(gate) * up */
    float *scores; /* [heads, len] each thread's stretch of the attention scores */
    float *parts;  /* [threads, heads, dim + 2] the attention parts */
    float *h;      /* this thread's [hidden] normed input of a projection */
    float *q;      /* this thread's [heads, dim] rotated queries */
    float *attn;   /* this thread's [heads, dim] attention output */
    float *q_scales; /* this thread's int8 copy of a product's input: its blocks' scales */
    int8_t *q8;      /* and its int8 values (integer dot products) */
} Buffers;

static int64_t widest_input(const Shape *s) {
    int64_t q_size = (int64_t)s->heads * s->head_dim, n = s->intermediate > s->hidden ? s->intermediate : s->hidden;
    return q_size > n ? q_size : n;
}

static int64_t own_floats(const Shape *s) {
    int64_t n = widest_input(s);
    return s->hidden + 2 * (int64_t)s->heads * s->head_dim + (n + QBLOCK - 1) / QBLOCK + (n + 3) / 4;
}

int64_t scratch_floats(const Shape *s, int64_t max_len) {
    int64_t qkv = (int64_t)(s->heads + 2 * s->kv_heads) * s->head_dim;
    int64_t parts = (int64_t)s->threads * s->heads * (s->head_dim + 2);
    return s->hidden + qkv + s->intermediate + (int64_t)s->heads * max_len + parts + s->threads * own_floats(s);
}

static Buffers buffers(const Shape *s, const Step *st, int thread) {
    Buffers b;
    b.x = st->scratch;
    b.qkv = b.x + s->hidden;
    b.act = b.qkv + (s->heads + 2 * s->kv_heads) * s->head_dim;
    b.scores = b.act + s->intermediate;
    b.parts = b.scores + (int64_t)s->heads * st->len;
    b.h = b.parts + (int64_t)s->threads * s->heads * (s->head_dim + 2) + thread * own_floats(s);
    b.q = b.h + s->hidden;
    b.attn = b.q + s->heads * s->head_dim;
    b.q_scales = b.attn + s->heads * s->head_dim;
    b.q8 = (int8_t *)(b.q_scales + (widest_input(s) + QBLOCK - 1) / QBLOCK);
    return b;
}

/* A product's input: under integer dot products also quantised into this thread's int8 buffer (each thread
 * quantises for itself, a few microseconds, rather than waiting at a barrier). */
static Input input(const Shape *s, const float *x, int n, const Buffers *b) {
    Input in = {x, 0, 0};
    if (s->int_dots) {
        quantize_input(x, n, b->q8, b->q_scales);
        in.q = b->q8;
        in.scales = b->q_scales;
    }
    return in;
}

/* QK-norm (if the model has it) and RoPE of one head's vector, in place. */
static void prepare_head(float *vec, const float *norm, const float *cos_sin, const Shape *s) {
    if (norm) rms_norm(vec, norm, s->head_dim, s->qk_eps, vec);
    rotate(vec, cos_sin, s->head_dim);
}

/* The attention block of one layer: norm, QKV, QK-norm and RoPE, the KV write, attention, o_proj + residual.
 * Three barriers: after the QKV projection, after the attention parts, after o_proj. What every thread needs
 * whole (the normed input, the rotated queries, the merged attention) each computes for itself: a few
 * thousand flops instead of a barrier. */
static void attention_block(const Shape *s, const Layer *L, const Step *st, const Buffers *b, int thread,
                            int nthreads) {
    int dim = s->head_dim, q_size = s->heads * dim, kv_size = s->kv_heads * dim;
    rms_norm(b->x, L->input_norm, s->hidden, s->eps, b->h);
    gemv_rows(L->qkv, input(s, b->h, s->hidden, b), q_size + 2 * kv_size, s->hidden, L->qkv_bias, b->qkv);
#pragma omp barrier
    const float *cos_sin = st->rope + *st->position * dim;
    for (int i = 0; i < q_size; i++) b->q[i] = b->qkv[i];
    for (int head = 0; head < s->heads; head++) prepare_head(b->q + head * dim, L->q_norm, cos_sin, s);
    int64_t begin, end;
    share(st->len, 4, &begin, &end);
    if (begin <= st->len - 1 && st->len - 1 < end) { /* this thread's stretch holds the new token: write it */
        int64_t slot = st->slots[st->len - 1];
        for (int g = 0; g < s->kv_heads; g++) {
            float *k = b->qkv + q_size + g * dim;
            prepare_head(k, L->k_norm, cos_sin, s);
            float *k_dst = L->k_cache + (slot * s->kv_heads + g) * dim;
            float *v_dst = L->v_cache + (slot * s->kv_heads + g) * dim;
            const float *v = b->qkv + q_size + kv_size + g * dim;
            for (int d = 0; d < dim; d++) { k_dst[d] = k[d]; v_dst[d] = v[d]; }
        }
    }
    attend_part(s, b->q, L->k_cache, L->v_cache, st->slots, st->len, b->scores,
                b->parts + (int64_t)thread * s->heads * (dim + 2));
#pragma omp barrier
    merge_parts(s, b->parts, nthreads, b->attn);
    gemv_rows(L->o_proj, input(s, b->attn, q_size, b), s->hidden, q_size, b->x, b->x);
#pragma omp barrier
}

/* The MLP block: norm, gate/up with SiLU, down + residual; two barriers. */
static void mlp_block(const Shape *s, const Layer *L, const Buffers *b) {
    rms_norm(b->x, L->post_norm, s->hidden, s->eps, b->h);
    gate_up_rows(L->gate_up, input(s, b->h, s->hidden, b), s->intermediate, s->hidden, b->act);
#pragma omp barrier
    gemv_rows(L->down, input(s, b->act, s->intermediate, b), s->hidden, s->intermediate, b->x, b->x);
#pragma omp barrier
}

/* A greedy step's logits through the float32 LM head read mostly as its int8 copy: every row's logit estimated
 * on the int8 copy and the quantised final hidden state (a quarter of the bytes), with a bound on the estimate's
 * error; only the rows whose estimate could reach the best row's lower end are computed in float32, exactly as
 * gemv_rows computes them, and the others are set to -infinity. The largest logit, and the first row holding it,
 * are then the ones of the full float32 product.
 *
 * The bound, for row r with weights w (int8 copy s_r q, |w - s_r q| <= s_r / 2) and the hidden state h (block b
 * quantised with scale t_b, |h - t_b p| <= t_b / 2): |w.h - approx| <= sum_b t_b / 2 |w_b|_1 + s_r / 2 |h~|_1,
 * with |h~|_1 <= |h|_1 + sum_b t_b / 2 per value; each half taken as 0.5005 for the rounding of the quantisers.
 * The estimate's own float sums (a block's integer sum times its scale, at most 127 |h~_b|_1 in size, summed over
 * the blocks) are off by at most s_r |h~|_1 127 (blocks + 4) 2^-24, taken twice over; the float32 sum of an exact
 * row by at most n 2^-24 |w|_1 max|h|, taken twice over, and a relative 1e-4 more covers what is left. A bound on
 * |float32 row - estimate| is all it takes: the best float32 row's estimate plus its bound is at least its
 * float32 logit, at least every other row's, at least every row's estimate minus its bound; so it is kept. */
static void screened_logits(const Shape *s, const Step *st, const Buffers *b, int thread, int nthreads) {
    int n = s->hidden, blocks = (n + QBLOCK - 1) / QBLOCK;
    quantize_input(b->h, n, b->q8, b->q_scales);
    Input in = {b->h, b->q8, b->q_scales};
    float h_q = 0.0f, h_max = 0.0f;
    for (int k = 0; k < n; k++) {
        float a = fabsf(b->h[k]);
        h_q += a;
        h_max = a > h_max ? a : h_max;
    }
    for (int k = 0; k < blocks; k++) h_q += 0.5005f * b->q_scales[k] * (k + 1 < blocks ? QBLOCK : n - k * QBLOCK);
    h_q *= 1.001f;
    float rounding = (float)n * 1.2e-7f * h_max, estimate_rounding = 127.0f * (float)(blocks + 4) * 1.2e-7f;
    gemv_tiled(st->screen, in, s->vocab, n, 0, st->logits);
    int64_t begin, end;
    share(s->vocab, TILE, &begin, &end); /* the rows gemv_tiled gave this thread */
    float top = -INFINITY;
    for (int64_t r = begin; r < end; r++) {
        const float *norms = st->screen_l1 + r * blocks;
        float in_err = 0.0f, l1 = 0.0f;
        for (int k = 0; k < blocks; k++) {
            in_err += b->q_scales[k] * norms[k];
            l1 += norms[k];
        }
        float bound = (0.5005f * in_err + (0.5005f + estimate_rounding) * st->screen.scales[r] * h_q
                       + rounding * l1 + 1e-4f * fabsf(st->logits[r])) * 1.0001f + 1e-5f;
        st->screen_bounds[r] = bound;
        float lower = st->logits[r] - bound;
        top = lower > top ? lower : top;
    }
    st->screen_tops[thread] = top;
#pragma omp barrier
    for (int i = 0; i < nthreads; i++) top = st->screen_tops[i] > top ? st->screen_tops[i] : top;
    Input exact = {b->h, 0, 0};
    for (int64_t r = begin; r < end; r++)
        st->logits[r] = st->logits[r] + st->screen_bounds[r] >= top ? row1(st->lm_head, r, exact, n) + 0.0f
                                                                     : -INFINITY;
}

/* The whole step: embedding row, every layer, final norm and logits. */
void decode_step(const Shape *s, const Layer *layers, const Step *st) {
    const float *row = st->embedding + *st->token * s->hidden;
    for (int k = 0; k < s->hidden; k++) st->scratch[k] = row[k];
#pragma omp parallel num_threads(s->threads)
    {
#ifdef _OPENMP
        int thread = omp_get_thread_num(), nthreads = omp_get_num_threads();
#else
        int thread = 0, nthreads = 1;
#endif
        Buffers b = buffers(s, st, thread);
        for (int layer = 0; layer < s->layers; layer++) {
            attention_block(s, &layers[layer], st, &b, thread, nthreads);
            mlp_block(s, &layers[layer], &b);
        }
        rms_norm(b.x, st->final_norm, s->hidden, s->eps, b.h);
        if (st->screen.values)
            screened_logits(s, st, &b, thread, nthreads);
        else
            gemv_rows(st->lm_head, input(s, b.h, s->hidden, &b), s->vocab, s->hidden, 0, st->logits);
    }
}

/* y = W x over rows [0, rows), for measuring the product alone against torch's. */
void gemv(const float *w, const float *x, int64_t rows, int n, float *y, int threads) {
#pragma omp parallel num_threads(threads)
    gemv_rows((Weight){w, 0}, (Input){x, 0, 0}, rows, n, 0, y);
}

/* y = (values * scales[:, None]) x over rows [0, rows), the int8 product alone (its test and its timing). */
void gemv_int8(const int8_t *values, const float *scales, const float *x, int64_t rows, int n, float *y,
               int threads) {
#pragma omp parallel num_threads(threads)
    gemv_rows((Weight){values, scales}, (Input){x, 0, 0}, rows, n, 0, y);
}

/* The same product with integer dot products: values row-major (tiled here into a copy, as the step's weights
 * are when it is built), x quantised once into q [n] and q_scales [ceil(n / 32)] (for the test to read). */
void gemv_int8_dots(const int8_t *values, const float *scales, const float *x, int64_t rows, int n, float *y,
                    int threads, int8_t *q, float *q_scales) {
    int8_t *tiled = malloc((size_t)rows * n);
    if (!tiled) return;
    tile_int8(values, rows, n, tiled);
    quantize_input(x, n, q, q_scales);
    Input in = {x, q, q_scales};
#pragma omp parallel num_threads(threads)
    gemv_rows((Weight){tiled, scales}, in, rows, n, 0, y);
    free(tiled);
}

/* scores[i] = e^(scores[i] - top) for i < len, in place; returns their sum. */
static float exp_shifted(float *scores, int64_t len, float top) {
    __m256 shift = _mm256_set1_ps(top), sum = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + i), shift));
        _mm256_storeu_ps(scores + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    float total = hsum(sum);
    for (; i < len; i++) {
        scores[i] = expf(scores[i] - top);
        total += scores[i];
    }
    return total;
}

/* The eight sums of eight accumulators, as one vector (lane j: the sum of a[j]'s lanes): two rounds of pairwise
 * adds and one of halves, instead of a horizontal sum for each. */
static inline __m256 sums8(const __m256 a[8]) {
    __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

/* One query head's scaled scores against the key rows of tokens [0, len) (rows[t]: token t's key for this KV
 * head), eight tokens at a time where dim is a multiple of 8, the rest one at a time; returns the largest. */
static float head_scores(const float *qh, const float *const *rows, int64_t len, int dim, float scale,
                         float *scores) {
    __m256 top8 = _mm256_set1_ps(-INFINITY), scale8 = _mm256_set1_ps(scale);
    int64_t t = 0;
    for (; dim % 8 == 0 && t + 8 <= len; t += 8) {
        __m256 acc[8];
        for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
        for (int c = 0; c < dim; c += 8) {
            __m256 qv = _mm256_loadu_ps(qh + c);
            for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(rows[t + j] + c), qv, acc[j]);
        }
        __m256 s = _mm256_mul_ps(sums8(acc), scale8);
        _mm256_storeu_ps(scores + t, s);
        top8 = _mm256_max_ps(top8, s);
    }
    float top = hmax(top8);
    for (; t < len; t++) {
        scores[t] = dot(qh, rows[t], dim) * scale;
        top = scores[t] > top ? scores[t] : top;
    }
    return top;
}

#define VALUE_HEADS 4 /* query heads whose outputs accumulate together: 4 x 2 vectors of 8 in registers */

/* out[h] = sum over t of p[h][t] * rows[t] for heads [0, heads) (p: [heads, len] with row stride len; dim a
 * multiple of 16), 16 floats of every head at a time, each value row read once per 16 floats for them all. */
static void weighted_values(const float *p, int64_t len, const float *const *rows, int heads, int dim,
                            float *out) {
    for (int h0 = 0; h0 < heads; h0 += VALUE_HEADS) {
        int n = heads - h0 < VALUE_HEADS ? heads - h0 : VALUE_HEADS;
        for (int c = 0; c < dim; c += 16) {
            __m256 acc[VALUE_HEADS][2];
            for (int h = 0; h < VALUE_HEADS; h++) acc[h][0] = acc[h][1] = _mm256_setzero_ps();
            for (int64_t t = 0; t < len; t++) {
                __m256 v0 = _mm256_loadu_ps(rows[t] + c), v1 = _mm256_loadu_ps(rows[t] + c + 8);
                for (int h = 0; h < VALUE_HEADS; h++) {
                    if (h < n) {
                        __m256 w = _mm256_broadcast_ss(p + (h0 + h) * len + t);
                        acc[h][0] = _mm256_fmadd_ps(w, v0, acc[h][0]);
                        acc[h][1] = _mm256_fmadd_ps(w, v1, acc[h][1]);
                    }
                }
            }
            for (int h = 0; h < n; h++) {
                _mm256_storeu_ps(out + (h0 + h) * dim + c, acc[h][0]);
                _mm256_storeu_ps(out + (h0 + h) * dim + c + 8, acc[h][1]);
            }
        }
    }
}

/* weighted_values with AVX-512 (dim a multiple of 16): up to 64 floats of up to four heads at a time in
 * registers (16 accumulators), so each value row is read once per 64 floats, with a third of AVX2's
 * instructions. */
__attribute__((target("avx512f,fma"))) static void weighted_values_wide(const float *p, int64_t len,
                                                                         const float *const *rows, int heads,
                                                                         int dim, float *out) {
    for (int h0 = 0; h0 < heads; h0 += VALUE_HEADS) {
        int n = heads - h0 < VALUE_HEADS ? heads - h0 : VALUE_HEADS;
        for (int c = 0; c < dim; c += 64) {
            int vecs = (dim - c) / 16 < 4 ? (dim - c) / 16 : 4;
            __m512 acc[VALUE_HEADS][4];
            for (int h = 0; h < VALUE_HEADS; h++)
                for (int i = 0; i < 4; i++) acc[h][i] = _mm512_setzero_ps();
            for (int64_t t = 0; t < len; t++) {
                __m512 v[4];
                for (int i = 0; i < 4; i++)
                    v[i] = i < vecs ? _mm512_loadu_ps(rows[t] + c + 16 * i) : _mm512_setzero_ps();
                for (int h = 0; h < VALUE_HEADS; h++) {
                    if (h < n) {
                        __m512 w = _mm512_set1_ps(p[(h0 + h) * len + t]);
                        for (int i = 0; i < 4; i++)
                            if (i < vecs) acc[h][i] = _mm512_fmadd_ps(w, v[i], acc[h][i]);
                    }
                }
            }
            for (int h = 0; h < n; h++)
                for (int i = 0; i < vecs; i++) _mm512_storeu_ps(out + (h0 + h) * dim + c + 16 * i, acc[h][i]);
        }
    }
}

/* This thread's units of a batch's decode attention (a unit: one row's KV head with the query heads that share it,
 * its group), taken dynamically (rows differ in length); called by every thread of a parallel region. Row b reads
 * the slot list slots[row_seq[b]] (slots[b] when row_seq is NULL). See decode_attention. */
static void attend_units(const float *q, const float *k_cache, const float *v_cache, const int64_t *slots,
                         const int64_t *lens, const int64_t *row_seq, int64_t batch, int64_t max_len, int heads,
                         int kv_heads, int dim, float scale, float *out, int avx512) {
    int group = heads / kv_heads, blocked = dim % 16 == 0;
    int64_t row = (int64_t)kv_heads * dim, room = max_len > 0 ? max_len : 1;
    float *scores = malloc(sizeof(float) * (size_t)group * (size_t)room);
    const float **keys = malloc(sizeof(float *) * (size_t)room), **values = malloc(sizeof(float *) * (size_t)room);
#pragma omp for schedule(dynamic)
    for (int64_t unit = 0; unit < batch * kv_heads; unit++) {
        int64_t b = unit / kv_heads, g = unit % kv_heads, len = lens[b];
        const int64_t *own = slots + (row_seq ? row_seq[b] : b) * max_len;
        const float *qg = q + (b * heads + g * group) * dim;
        float *og = out + (b * heads + g * group) * dim;
        for (int64_t t = 0; t < len; t++) {
            keys[t] = k_cache + own[t] * row + g * dim;
            values[t] = v_cache + own[t] * row + g * dim;
            /* every line of the unit's keys and values asked for at once: the rows lie wherever their slots are,
             * which no hardware prefetcher follows, and one at a time each waits out the memory's latency (a
             * prefill's tokens, rows over one list, find their prefix in the cache: the token before read it) */
            for (int64_t line = 0; !row_seq && line < dim; line += 16) {
                _mm_prefetch((const char *)(keys[t] + line), _MM_HINT_T0);
                _mm_prefetch((const char *)(values[t] + line), _MM_HINT_T1);
            }
        }
        float total[group];
        for (int h = 0; h < group; h++) {
            float *sh = scores + h * len;
            total[h] = exp_shifted(sh, len, head_scores(qg + h * dim, keys, len, dim, scale, sh));
        }
        if (blocked && avx512) {
            weighted_values_wide(scores, len, values, group, dim, og);
        } else if (blocked) {
            weighted_values(scores, len, values, group, dim, og);
        } else {
            for (int64_t i = 0; i < (int64_t)group * dim; i++) og[i] = 0.0f;
            for (int64_t t = 0; t < len; t++)
                for (int h = 0; h < group; h++) axpy(og + h * dim, scores[h * len + t], values[t], dim);
        }
        for (int h = 0; h < group; h++) {
            float inv = 1.0f / total[h];
            for (int d = 0; d < dim; d++) og[h * dim + d] *= inv;
        }
    }
    free(scores);
    free(keys);
    free(values);
}

/* Decode attention for a batch of requests, one query token each, over a layer's float32 pool [slots, kv_heads,
 * dim]: q and out [batch, heads, dim]; slots [batch, max_len] (row b's first lens[b] entries are request b's
 * cached tokens, the rest unread). What the torch backend's decode steps call on a float32 CPU engine, in place of
 * gathering every request's keys and values into a padded block for a masked SDPA. The unit of work is one
 * request's KV head with the query heads that share it (its group); threads take units dynamically (requests
 * differ in length). Scores come eight tokens at a time (eight accumulators summed in one vector: a horizontal
 * sum per score and a scalar expf per weight were most of the time), the exponentials eight at a time, and the
 * weighted values 16 floats of every head of the group at a time (64 with `avx512`, for a CPU that has it). Softmax
 * in float32 with the maximum subtracted. For a head size that is not a multiple of 16, one value row at a time
 * (and for one not a multiple of 8, one score at a time). */
void decode_attention(const float *q, const float *k_cache, const float *v_cache, const int64_t *slots,
                      const int64_t *lens, int64_t batch, int64_t max_len, int heads, int kv_heads, int dim,
                      float scale, float *out, int threads, int avx512) {
#pragma omp parallel num_threads(threads)
    attend_units(q, k_cache, v_cache, slots, lens, 0, batch, max_len, heads, kv_heads, dim, scale, out, avx512);
}

/* decode_attention straight from the QKV projection's output qkv [batch, (heads + 2 kv_heads) * dim] (q, then k,
 * then v): each row's heads get QK-norm (q_norm and k_norm, or neither: NULL) and RoPE at positions[b] (rope:
 * [positions, dim], cos then sin), the rotated queries go to q [batch, heads, dim] (the caller's buffer) and the
 * new key and value into the pool at out_loc[b], then the attention. Through torch that was a split, a rotation of
 * several ops and two index copies per layer, a large share of what a batched decode step spent outside its
 * products. The rows are shared out first; the implicit barrier after them puts every new key in the
 * pool before any row attends.
 *
 * A row is a decode step's request, or a prefill's token: token i of a sequence is a row over the sequence's
 * slots up to its own (lens[b] = its position + 1), all of a sequence's tokens reading one slot list (row_seq[b]:
 * which row of slots; NULL for one list per row). Each token then reads its prefix's keys and values again, so
 * this suits short sequences, whose keys and values stay in the cache from one token to the next. */
void attend_from_qkv(const float *qkv, const int64_t *positions, const float *rope, const float *q_norm,
                     const float *k_norm, float qk_eps, float *k_cache, float *v_cache, const int64_t *out_loc,
                     const int64_t *slots, const int64_t *lens, const int64_t *row_seq, int64_t batch,
                     int64_t max_len, int heads, int kv_heads, int dim, float scale, float *q, float *out,
                     int threads, int avx512) {
    Shape shape = {0};
    shape.head_dim = dim;
    shape.qk_eps = qk_eps;
    int64_t q_size = (int64_t)heads * dim, kv_size = (int64_t)kv_heads * dim;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for
        for (int64_t b = 0; b < batch; b++) {
            const float *row = qkv + b * (q_size + 2 * kv_size), *cos_sin = rope + positions[b] * dim;
            float *qb = q + b * q_size;
            float *k_dst = k_cache + out_loc[b] * kv_size, *v_dst = v_cache + out_loc[b] * kv_size;
            memcpy(qb, row, sizeof(float) * (size_t)q_size);
            memcpy(k_dst, row + q_size, sizeof(float) * (size_t)kv_size);
            memcpy(v_dst, row + q_size + kv_size, sizeof(float) * (size_t)kv_size);
            for (int h = 0; h < heads; h++) prepare_head(qb + h * dim, q_norm, cos_sin, &shape);
            for (int g = 0; g < kv_heads; g++) prepare_head(k_dst + g * dim, k_norm, cos_sin, &shape);
        }
        attend_units(q, k_cache, v_cache, slots, lens, row_seq, batch, max_len, heads, kv_heads, dim, scale, out,
                     avx512);
    }
}
