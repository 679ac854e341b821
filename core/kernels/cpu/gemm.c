/* y = x w^T (+ bias) in float32 on an x86-64 CPU with AVX-512: every float32 linear of a CPU engine.
 *
 * Why it exists: a decode step of a few dozen requests multiplies a few dozen rows by every weight. oneDNN's
 * packed GEMM ran those well under this CPU's float32 matmul rate, and torch's BLAS was slower still at those
 * row counts (docs/BENCHMARKS.md). The shape is the textbook one: the weight is packed once into panels of PANEL
 * output features, k-major, so that for each input feature a panel's PANEL weights are three contiguous 64-byte
 * vectors; a block of ROWS input rows is multiplied against a whole panel with ROWS x 3 vector accumulators (24
 * of the 32 registers), the input values broadcast one at a time. A panel is read from memory once per chunk of
 * rows and from the L2 cache for the chunk's other blocks; while a panel is in use, the next one is prefetched at
 * the pace the work consumes it (the hardware prefetcher does not run far enough ahead of a stream this fast). The
 * threads split the panels, so each streams its own stretch of the weight and writes its own columns of y: no barrier
 * inside a product.
 *
 * Each output is one sum over k in order (one accumulator, fused multiply-adds), whatever the number of rows:
 * a request's products do not depend on which other requests share its batch. The order differs from torch's
 * BLAS, so results are close to F.linear's (float32 rounding), not bit-identical.
 *
 * Panel layout: panels[p][i][j] = w[p * PANEL + j][i] for output feature p * PANEL + j and input feature i, zero
 * past the last output feature.
 *
 * A weight that holds only 4-bit codes (what a Q4_1 GGUF dequantises to: in each block of Q4_BLOCK inputs of a row,
 * w = d q + m with q in 0..15, one rounding of an exact product plus m) can be given as its codes and the blocks' d
 * and m instead (pack_q4): 36 bytes for every 48 weights of a panel's input rather than 192. Each thread expands its
 * panel into float32 in a scratch buffer (one fused multiply-add per weight: the same single rounding, so the very
 * floats the float32 panels hold) and runs the same blocks over it from its cache: the products are bit-identical to
 * the float32 panels', with a sixth of the bytes read from memory.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "exp8.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define PANEL 48       /* output features per panel: three 16-float vectors */
#define ROWS 8         /* input rows per block: 8 x 3 accumulators (products() has a loop for each count to 8) */
/* A chunk of rows' inputs, kept in L2 while every panel passes over it: every panel is read from memory once per
 * chunk. 128 KB made chunks of 16 rows for SmolLM2's down projection (1,536 inputs), so at 32 rows its weights
 * were read twice (at 512 rows 32 times): 512 KB makes 80-row chunks there, so a decode step reads each weight
 * once. */
#define CHUNK_BYTES (512 * 1024)
#define MAX_CHUNK 128
/* Beside the paced T0 prefetch of the next panel, the same stream FAR_AHEAD bytes further on into L2 (T1): the near
 * prefetch alone leaves a stream from memory bound by its latency, most at few rows (64 KB: worse;
 * docs/BENCHMARKS.md). */
#define FAR_AHEAD 16384

int64_t panel_floats(int64_t n, int64_t k) { return (n + PANEL - 1) / PANEL * PANEL * k; }

/* ---- 4-bit panels -----------------------------------------------------------------------------------------------
 * Panel p, input block b (Q4_BLOCK inputs) is Q4_BYTES bytes: for each pair of inputs (i, i + 1) of the block and
 * each of the panel's three 16-feature vectors, 16 bytes whose low nibbles are feature j's code at i and high nibbles
 * its code at i + 1; then the block's d for the 48 features and its m for them (float32). Zero past the last
 * feature. */
#define Q4_BLOCK 32
#define Q4_BYTES (Q4_BLOCK / 2 * PANEL + 2 * PANEL * 4)
/* Inputs of a 4-bit panel expanded at a time (a multiple of Q4_BLOCK): PANEL x Q4_SLAB floats, 24 KB, in the L1
 * cache beside the rows' inputs. */
#define Q4_SLAB 128

int64_t q4_slab_floats(void) { return Q4_SLAB * PANEL; }

int64_t q4_panel_bytes(int64_t n, int64_t k) { return (n + PANEL - 1) / PANEL * (k / Q4_BLOCK) * Q4_BYTES; }

/* codes [n, k] (0..15), d and m [n, k / Q4_BLOCK], into the layout above; k a multiple of Q4_BLOCK. */
void pack_q4(const uint8_t *codes, const float *d, const float *m, int64_t n, int64_t k, uint8_t *out) {
    int64_t count = (n + PANEL - 1) / PANEL, blocks = k / Q4_BLOCK;
    for (int64_t p = 0; p < count; p++)
        for (int64_t b = 0; b < blocks; b++) {
            uint8_t *dst = out + (p * blocks + b) * Q4_BYTES;
            float *dm = (float *)(dst + Q4_BLOCK / 2 * PANEL);
            for (int64_t j = 0; j < PANEL; j++) {
                int64_t row = p * PANEL + j;
                for (int64_t pair = 0; pair < Q4_BLOCK / 2; pair++) {
                    int64_t i = b * Q4_BLOCK + 2 * pair;
                    uint8_t lo = row < n ? codes[row * k + i] : 0, hi = row < n ? codes[row * k + i + 1] : 0;
                    dst[pair * PANEL + j] = (uint8_t)(lo | hi << 4);
                }
                dm[j] = row < n ? d[row * blocks + b] : 0.0f;
                dm[PANEL + j] = row < n ? m[row * blocks + b] : 0.0f;
            }
        }
}

/* One panel's float32 weights [k][PANEL] from its 4-bit form: w = fma(q, d, m), exact product, one rounding. */
__attribute__((target("avx512f,fma"))) static void expand_q4(const uint8_t *q4, int64_t k, float *panel) {
    for (int64_t b = 0; b < k / Q4_BLOCK; b++) {
        const uint8_t *src = q4 + b * Q4_BYTES;
        const float *dm = (const float *)(src + Q4_BLOCK / 2 * PANEL);
        __m512 d[3], m[3];
        for (int v = 0; v < 3; v++) {
            d[v] = _mm512_loadu_ps(dm + 16 * v);
            m[v] = _mm512_loadu_ps(dm + PANEL + 16 * v);
        }
        float *dst = panel + b * Q4_BLOCK * PANEL;
        const __m512i low = _mm512_set1_epi32(15);
        for (int pair = 0; pair < Q4_BLOCK / 2; pair++)
            for (int v = 0; v < 3; v++) {
                __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(src + pair * PANEL + 16 * v)));
                __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(c, low));
                __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(c, 4));
                _mm512_storeu_ps(dst + (2 * pair) * PANEL + 16 * v, _mm512_fmadd_ps(lo, d[v], m[v]));
                _mm512_storeu_ps(dst + (2 * pair + 1) * PANEL + 16 * v, _mm512_fmadd_ps(hi, d[v], m[v]));
            }
    }
}

void pack_panels(const float *w, int64_t n, int64_t k, float *panels) {
    int64_t count = (n + PANEL - 1) / PANEL;
    for (int64_t p = 0; p < count; p++)
        for (int64_t i = 0; i < k; i++)
            for (int64_t j = 0; j < PANEL; j++) {
                int64_t row = p * PANEL + j;
                panels[(p * k + i) * PANEL + j] = row < n ? w[row * k + i] : 0.0f;
            }
}

/* Spreads the prefetch of the next panel's lines evenly over the iterations of the current one. */
typedef struct {
    const char *next; /* the next panel, or NULL */
    int64_t lines;    /* its 64-byte lines */
    int64_t period;   /* iterations over the current panel (every block's k) */
    int64_t credit, done;
} Prefetch;

static inline void prefetch_tick(Prefetch *pf) {
    pf->credit += pf->lines;
    while (pf->credit >= pf->period) {
        if (pf->next) {
            _mm_prefetch(pf->next + pf->done * 64, _MM_HINT_T0);
            _mm_prefetch(pf->next + pf->done * 64 + FAR_AHEAD, _MM_HINT_T1);
        }
        pf->done++;
        pf->credit -= pf->period;
    }
}

/* Rows [0, rows) of x (row stride ldx) against `len` input features of one panel (`panel` at the first of them),
 * into y's columns [0, cols) (row stride ldy). A panel's inputs can come in several slabs, in order: the first
 * starts the sums from zero, a later one reloads them from y where the one before left them (a float32 stored and
 * loaded is the same float, so each output is still one fused multiply-add chain over k in order), and the last
 * adds the bias. Inlined with a constant `rows` (1 to ROWS), so the accumulators stay in registers. */
__attribute__((target("avx512f,fma"), always_inline)) static inline void block(
    const float *x, int64_t ldx, int64_t len, const float *panel, int rows, int first, int last, const float *bias,
    float *y, int64_t ldy, int cols, Prefetch *pf) {
    __mmask16 mask[3];
    for (int v = 0; v < 3; v++) {
        int left = cols - 16 * v;
        mask[v] = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
    }
    __m512 acc[ROWS][3];
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < 3; v++)
            acc[r][v] = first || r >= rows ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[v], y + r * ldy + 16 * v);
    for (int64_t i = 0; i < len; i++) {
        const float *w = panel + i * PANEL;
        __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(w + 32);
        prefetch_tick(pf);
        for (int r = 0; r < ROWS; r++) {
            if (r < rows) {
                __m512 xv = _mm512_set1_ps(x[r * ldx + i]);
                acc[r][0] = _mm512_fmadd_ps(xv, w0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(xv, w1, acc[r][1]);
                acc[r][2] = _mm512_fmadd_ps(xv, w2, acc[r][2]);
            }
        }
    }
    for (int v = 0; v < 3; v++) {
        __m512 b = last && bias ? _mm512_maskz_loadu_ps(mask[v], bias + 16 * v) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++)
            _mm512_mask_storeu_ps(y + r * ldy + 16 * v, mask[v], last ? _mm512_add_ps(acc[r][v], b) : acc[r][v]);
    }
}

/* This thread's items [begin, end) of `count` (panels, or a prologue's rows): contiguous stretches, as even as
 * they divide. */
static inline void share(int64_t count, int64_t *begin, int64_t *end) {
#ifdef _OPENMP
    int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
#else
    int64_t threads = 1, t = 0;
#endif
    int64_t per = count / threads, extra = count % threads;
    *begin = t * per + (t < extra ? t : extra);
    *end = *begin + per + (t < extra);
}

/* This thread's share of the products: its panels, against every row of x, chunk by chunk of rows. With q4 (the
 * 4-bit form, panels unused) each panel is expanded Q4_SLAB inputs at a time into this thread's scratch, and every
 * block of rows runs over that slab before the next is expanded: the slab stays in the L1 cache. (Expanding the
 * whole panel first wrote PANEL x k floats, 110-295 KB for SmolLM2, through to the L2 cache and read them back.) */
__attribute__((target("avx512f,fma"))) static void products(const float *x, int64_t m, int64_t k,
                                                             const float *panels, const uint8_t *q4, float *scratch,
                                                             int64_t n, const float *bias, float *y) {
    int64_t count = (n + PANEL - 1) / PANEL, begin, end;
    int64_t chunk = k > 0 ? CHUNK_BYTES / (4 * k) / ROWS * ROWS : MAX_CHUNK;
    chunk = chunk < ROWS ? ROWS : chunk > MAX_CHUNK ? MAX_CHUNK : chunk;
    int64_t slab = q4 ? Q4_SLAB : k, bytes = q4 ? k / Q4_BLOCK * Q4_BYTES : k * PANEL * 4;
#ifdef _OPENMP
    float *own = scratch ? scratch + (int64_t)omp_get_thread_num() * Q4_SLAB * PANEL : 0;
#else
    float *own = scratch;
#endif
    share(count, &begin, &end);
    for (int64_t m0 = 0; m0 < m; m0 += chunk) {
        int64_t rows = m - m0 < chunk ? m - m0 : chunk, blocks = (rows + ROWS - 1) / ROWS;
        for (int64_t p = begin; p < end; p++) {
            /* the panel's bytes, and the next one's to prefetch while the blocks run */
            const char *here = q4 ? (const char *)(q4 + p * bytes) : (const char *)(panels + p * k * PANEL);
            Prefetch pf = {p + 1 < end ? here + bytes : 0, bytes / 64, blocks * k, 0, 0};
            int cols = n - p * PANEL < PANEL ? (int)(n - p * PANEL) : PANEL;
            const float *b = bias ? bias + p * PANEL : 0;
            for (int64_t s0 = 0; s0 < k; s0 += slab) {
                int64_t len = k - s0 < slab ? k - s0 : slab;
                const float *part;
                if (q4) {
                    expand_q4((const uint8_t *)here + s0 / Q4_BLOCK * Q4_BYTES, len, own);
                    part = own;
                } else {
                    part = (const float *)here + s0 * PANEL;
                }
                int first = s0 == 0, last = s0 + len >= k;
                for (int64_t blk = 0; blk < blocks; blk++) {
                    const float *xb = x + (m0 + blk * ROWS) * k + s0;
                    float *yb = y + (m0 + blk * ROWS) * n + p * PANEL;
                    int64_t left = rows - blk * ROWS;
                    /* each row count its own copy of the loop: with `rows` unknown at compile time every
                     * iteration tested every row, and a block of four rows took as long as one of eight */
                    _Static_assert(ROWS == 8, "a case for each row count up to ROWS");
                    switch (left >= ROWS ? ROWS : left) {
#define BLOCK_OF(R) case R: block(xb, k, len, part, R, first, last, b, yb, n, cols, &pf); break;
                    BLOCK_OF(1) BLOCK_OF(2) BLOCK_OF(3) BLOCK_OF(4) BLOCK_OF(5) BLOCK_OF(6) BLOCK_OF(7) BLOCK_OF(8)
#undef BLOCK_OF
                    }
                }
            }
        }
    }
}

/* y [m, n] = x [m, k] w^T + bias (bias may be NULL), w given as pack_panels made it, or with q4 non-NULL as pack_q4
 * made it (scratch: threads x q4_slab_floats() floats). */
__attribute__((target("avx512f,fma"))) void gemm_panels(const float *x, int64_t m, int64_t k, const float *panels,
                                                         const uint8_t *q4, float *scratch, int64_t n,
                                                         const float *bias, float *y, int threads) {
#pragma omp parallel num_threads(threads)
    products(x, m, k, panels, q4, scratch, n, bias, y);
}

/* The products can start from work on their input's rows, done first by the same threads (rows shared out, one
 * barrier): at a decode step's few rows that is one call where torch ran eight small ops for a norm, each with
 * its own dispatch and threads. Whatever the rows, the prologue's floats are what torch's ops compute, up to the
 * order of a norm's sum and the exponential's last bit. */

static inline __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

/* e^x for sixteen floats: exp8.h's on each half (so the GEMM's SiLU and the decode step's softmax share one). */
__attribute__((target("avx512f,fma"))) static inline __m512 exp16(__m512 x) {
    __m256 low = exp8(_mm512_castps512_ps256(x));
    __m256 high = exp8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    __m512d wide = _mm512_castps_pd(_mm512_castps256_ps512(low));
    return _mm512_castpd_ps(_mm512_insertf64x4(wide, _mm256_castps_pd(high), 1));
}

/* Rows [begin, end) of x [rows, k]: out = rms_norm(v) * weight with v = x + residual, and sum = v (residual
 * NULL: v is x and sum is not written). torch's float32 norm: sum(v^2) / k, + eps, 1 / sqrt, times v, times the
 * weight. */
__attribute__((target("avx512f,fma"))) static void norm_rows(const float *x, const float *residual, float *sum,
                                                              const float *weight, int64_t begin, int64_t end,
                                                              int64_t k, float eps, float *out) {
    for (int64_t r = begin; r < end; r++) {
        const float *xr = x + r * k;
        float *vr = residual ? sum + r * k : (float *)xr;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < k; i += 16) {
            __mmask16 mask = tail_mask(k - i);
            __m512 v = _mm512_maskz_loadu_ps(mask, xr + i);
            if (residual) {
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, residual + r * k + i));
                _mm512_mask_storeu_ps(vr + i, mask, v);
            }
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        float inv = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)k + eps);
        __m512 scale = _mm512_set1_ps(inv);
        for (int64_t i = 0; i < k; i += 16) {
            __mmask16 mask = tail_mask(k - i);
            __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, vr + i), scale);
            _mm512_mask_storeu_ps(out + r * k + i, mask, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(mask, weight + i)));
        }
    }
}

/* Rows [begin, end) of gate_up [rows, 2k] (gate then up): out [rows, k] = silu(gate) * up, silu(g) = g / (1 + e^-g). */
__attribute__((target("avx512f,fma"))) static void silu_mul_rows(const float *gate_up, int64_t begin, int64_t end,
                                                                  int64_t k, float *out) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t r = begin; r < end; r++) {
        const float *gate = gate_up + r * 2 * k, *up = gate + k;
        for (int64_t i = 0; i < k; i += 16) {
            __mmask16 mask = tail_mask(k - i);
            __m512 g = _mm512_maskz_loadu_ps(mask, gate + i);
            __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
            _mm512_mask_storeu_ps(out + r * k + i, mask, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(mask, up + i)));
        }
    }
}

/* y = rms_norm(x + residual) w^T + bias, with normed [m, k] and sum [m, k] (x + residual; unwritten when residual
 * is NULL) as the caller's buffers. */
__attribute__((target("avx512f,fma"))) void norm_gemm_panels(const float *x, const float *residual,
                                                              const float *norm_weight, float eps, int64_t m,
                                                              int64_t k, const float *panels, const uint8_t *q4,
                                                              float *scratch, int64_t n, const float *bias,
                                                              float *normed, float *sum, float *y, int threads) {
#pragma omp parallel num_threads(threads)
    {
        int64_t begin, end;
        share(m, &begin, &end);
        norm_rows(x, residual, sum, norm_weight, begin, end, k, eps, normed);
#pragma omp barrier
        products(normed, m, k, panels, q4, scratch, n, bias, y);
    }
}

/* y = (silu(gate) * up) w^T for gate_up [m, 2k], with act [m, k] the caller's buffer. */
__attribute__((target("avx512f,fma"))) void silu_mul_gemm_panels(const float *gate_up, int64_t m, int64_t k,
                                                                  const float *panels, const uint8_t *q4,
                                                                  float *scratch, int64_t n, float *act, float *y,
                                                                  int threads) {
#pragma omp parallel num_threads(threads)
    {
        int64_t begin, end;
        share(m, &begin, &end);
        silu_mul_rows(gate_up, begin, end, k, act);
#pragma omp barrier
        products(act, m, k, panels, q4, scratch, n, 0, y);
    }
}

/* ---- A greedy batch's LM head, screened through an int8 copy ---------------------------------------------------
 *
 * A greedy step that wants no log-probabilities needs, of each row's logits, only the largest and the first index
 * holding it. The float32 LM head is most of a decode step's FLOPs (SmolLM2: 49,152 x 576); here every logit is first
 * estimated on an int8 copy of the head with AVX512-VNNI's integer dot products (a quarter of the bytes, 64 products
 * an instruction), with a rigorous bound on the estimate's error, and only the logits whose estimate plus bound
 * reaches the row's best lower end are computed in float32, exactly as products() computes them (lane by lane one
 * fused multiply-add chain over k in order from zero, on the same panels); every other logit comes back as
 * -infinity. A row's largest logit and the first index holding it are then the full product's: the best float32
 * logit's estimate plus its bound is at least that logit, which is at least every other logit, which is at least
 * every estimate minus its bound; so it is kept, as is every logit equal to it. This is decode.c's
 * screened_logits for many rows, with the weight read once for all of them.
 *
 * The estimate: weight row r quantised per row (q = round(w / s_r), |w - s_r q| <= s_r / 2); the input row in
 * blocks of SCREEN_BLOCK values (p = round(x / t_b), t_b = max|x_b| / 127, so an outlier costs only its block's
 * precision; one scale per row kept half the vocabulary on SmolLM2's final hidden states); est = s_r sum_b t_b
 * (sum q p over block b), each block's integer sum exact. Its error, as decode.c bounds it:
 *   |w.x - est| <= sum_b t_b / 2 |w_b|_1 + s_r / 2 |x~|_1,  |x~|_1 <= |x|_1 + sum_b t_b / 2 (values in b),
 * each half taken as 0.5005; the estimate's float sums over blocks off by at most s_r |x~|_1 127 (blocks + 4)
 * 2^-24 (taken twice over); a kept logit's float32 chain off the real w.x by at most k 2^-24 |w_r|_1 max|x| (taken
 * twice over); a relative 1e-4 and an absolute 1e-5 more.
 *
 * VNNI multiplies unsigned by signed bytes: the input goes in as p + 128, and 128 times the block's sum of q
 * (precomputed) is taken off each block's integer sum. The int8 head is packed SCREEN rows at a time, k-major in
 * groups of four inputs: packed[g][i / 4][j][i % 4] = q[g * SCREEN + j][i], zero past the last row and past k; the
 * blocks' sums of q and magnitudes |w_b|_1 as [g][block][j]. */
#define SCREEN 16        /* weight rows per group: one 64-byte vector of four-byte groups */
#define SCREEN_ROWS 8    /* input rows per block of the estimate */
#define SCREEN_BLOCK 32  /* inputs per quantisation block of an input row: eight four-byte steps */
#define SCREEN_HALF 0.5005f
#define SCREEN_EPS 1.2e-7f  /* twice 2^-24 */

int64_t screen_bytes(int64_t n, int64_t k) { return (n + SCREEN - 1) / SCREEN * SCREEN * ((k + 3) / 4 * 4); }
int64_t screen_blocks(int64_t k) { return (k + SCREEN_BLOCK - 1) / SCREEN_BLOCK; }

/* The packed copy of q [n, k] and, per group and block, its rows' sums of q (qsums) and magnitudes of w (l1,
 * float64 sums rounded up to float32 by the caller's w_l1 [n, blocks]; here only laid out). */
void screen_pack(const int8_t *q, const float *w_l1, int64_t n, int64_t k, int8_t *packed, int32_t *qsums,
                 float *l1) {
    int64_t groups = (n + SCREEN - 1) / SCREEN, k4 = (k + 3) / 4, blocks = screen_blocks(k);
    for (int64_t g = 0; g < groups; g++)
        for (int64_t j = 0; j < SCREEN; j++) {
            int64_t row = g * SCREEN + j;
            for (int64_t i4 = 0; i4 < k4; i4++)
                for (int64_t b = 0; b < 4; b++) {
                    int64_t i = i4 * 4 + b;
                    packed[((g * k4 + i4) * SCREEN + j) * 4 + b] = row < n && i < k ? q[row * k + i] : 0;
                }
            for (int64_t b = 0; b < blocks; b++) {
                int32_t sum = 0;
                for (int64_t i = b * SCREEN_BLOCK; i < k && i < (b + 1) * SCREEN_BLOCK; i++)
                    sum += row < n ? q[row * k + i] : 0;
                qsums[(g * blocks + b) * SCREEN + j] = sum;
                l1[(g * blocks + b) * SCREEN + j] = row < n ? w_l1[row * blocks + b] : 0.0f;
            }
        }
}

/* What the bound needs of an input row. */
typedef struct {
    float x_q;     /* |x~|_1, rounded up */
    float max;     /* max |x| */
} ScreenInput;

/* An input row's quantised copy (p + 128 as bytes, k padded to four with 128), its blocks' steps t_b and its
 * ScreenInput. */
static void screen_quantize(const float *x, int64_t k, uint8_t *xq, float *steps, ScreenInput *info) {
    float l1 = 0.0f, top = 0.0f;
    int64_t k4 = (k + 3) / 4 * 4;
    for (int64_t b0 = 0; b0 < k; b0 += SCREEN_BLOCK) {
        int64_t b1 = b0 + SCREEN_BLOCK < k ? b0 + SCREEN_BLOCK : k;
        float amax = 0.0f;
        for (int64_t i = b0; i < b1; i++) {
            float a = fabsf(x[i]);
            amax = a > amax ? a : amax;
            l1 += a;
        }
        float t = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int64_t i = b0; i < b1; i++) {
            int p = (int)nearbyintf(x[i] * inv);
            xq[i] = (uint8_t)((p > 127 ? 127 : p < -127 ? -127 : p) + 128);
        }
        steps[b0 / SCREEN_BLOCK] = t;
        l1 += SCREEN_HALF * t * (float)(b1 - b0);
        top = amax > top ? amax : top;
    }
    for (int64_t i = k; i < k4; i++) xq[i] = 128;
    info->x_q = l1 * (1.0f + SCREEN_EPS * (float)k) * 1.001f;
    info->max = top;
}

/* acc += a (unsigned bytes) . b (signed bytes), four products a lane: in asm, as GCC 12 copies the intrinsic's
 * accumulator in and out of another register around every use (two moves a product, twice the loop's work). */
__attribute__((target("avx512f,avx512vnni"))) static inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

/* Weight group g against input rows [0, rows) of a block of them: each logit's estimate plus its bound into y (row
 * stride n), and each row's lanes of the best lower end (estimate minus bound) so far into top (row stride 16).
 * Meanwhile `next` (the next group's bytes, or NULL) is prefetched, a few lines a block: the group after this one
 * arrives while this one is multiplied. */
__attribute__((target("avx512f,avx512bw,avx512vnni,fma"), always_inline)) static inline void screen_block(
    const uint8_t *xq, int64_t k4, int64_t k, const int8_t *group, int rows, const float *steps, int64_t blocks,
    const float *scales, const int32_t *qsums, const float *l1, const float *row_l1, const ScreenInput *info,
    float *y, int64_t n, __mmask16 mask, float *top, const int8_t *next) {
    __m512 est[SCREEN_ROWS], err[SCREEN_ROWS];
    for (int r = 0; r < SCREEN_ROWS; r++) est[r] = err[r] = _mm512_setzero_ps();
    int64_t lines = SCREEN * k4 / 64, per_block = (lines + blocks - 1) / blocks;
    for (int64_t b = 0; b < blocks; b++) {
        if (next)
            for (int64_t l = b * per_block; l < lines && l < (b + 1) * per_block; l++)
                _mm_prefetch((const char *)(next + l * 64), _MM_HINT_T0);
        __m512i acc[SCREEN_ROWS];
        for (int r = 0; r < SCREEN_ROWS; r++) acc[r] = _mm512_setzero_si512();
        int64_t i_end = (b + 1) * SCREEN_BLOCK < k4 ? (b + 1) * SCREEN_BLOCK : k4;
#pragma GCC unroll 8
        for (int64_t i = b * SCREEN_BLOCK; i < i_end; i += 4) {
            __m512i w = _mm512_loadu_si512((const void *)(group + i * SCREEN));
            for (int r = 0; r < SCREEN_ROWS; r++)
                if (r < rows) {
                    int32_t four;
                    memcpy(&four, xq + r * k4 + i, 4);
                    acc[r] = dpbusd(acc[r], _mm512_set1_epi32(four), w);
                }
        }
        __m512i offset = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(qsums + b * SCREEN)), 7);
        __m512 norms = _mm512_loadu_ps(l1 + b * SCREEN);
        for (int r = 0; r < SCREEN_ROWS; r++)
            if (r < rows) {
                __m512 t = _mm512_set1_ps(steps[r * blocks + b]);
                est[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r], offset)), t, est[r]);
                err[r] = _mm512_fmadd_ps(t, norms, err[r]);
            }
    }
    __m512 s = _mm512_maskz_loadu_ps(mask, scales), magnitudes = _mm512_maskz_loadu_ps(mask, row_l1);
    __m512 quantised = _mm512_mul_ps(_mm512_set1_ps(SCREEN_HALF + 127.0f * (float)(blocks + 4) * SCREEN_EPS), s);
    for (int r = 0; r < SCREEN_ROWS; r++)
        if (r < rows) {
            __m512 e = _mm512_mul_ps(est[r], s);
            __m512 b = _mm512_mul_ps(_mm512_set1_ps(SCREEN_HALF), err[r]);
            b = _mm512_fmadd_ps(quantised, _mm512_set1_ps(info[r].x_q), b);
            b = _mm512_fmadd_ps(_mm512_set1_ps(SCREEN_EPS * (float)k * info[r].max), magnitudes, b);
            b = _mm512_fmadd_ps(_mm512_set1_ps(1e-4f), _mm512_abs_ps(e), b);
            b = _mm512_fmadd_ps(b, _mm512_set1_ps(1.0001f), _mm512_set1_ps(1e-5f));
            _mm512_mask_storeu_ps(y + r * n, mask, _mm512_add_ps(e, b));
            float *t = top + r * 16;
            _mm512_storeu_ps(t, _mm512_mask_max_ps(_mm512_loadu_ps(t), mask, _mm512_loadu_ps(t), _mm512_sub_ps(e, b)));
        }
}

/* Logits [g * SCREEN, g * SCREEN + SCREEN) of input rows x[rows[0..count)] (count <= 4) as products() computes
 * them, lane by lane: one fused multiply-add chain over k from zero on the same panel columns (SCREEN divides
 * PANEL), then + 0 for the bias; up to four rows' chains side by side, as one chain waits on its last sum. */
__attribute__((target("avx512f,fma"))) static inline void exact_logits(const float *x, int64_t k, const float *panels,
                                                                        int64_t g, const int64_t *rows, int count,
                                                                        __m512 out[4]) {
    int64_t first = g * SCREEN;
    const float *w = panels + (first / PANEL) * k * PANEL + first % PANEL;
    const float *x0 = x + rows[0] * k, *x1 = x + rows[count > 1] * k, *x2 = x + rows[count > 2 ? 2 : 0] * k,
                *x3 = x + rows[count > 3 ? 3 : 0] * k;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < k; i++) {
        __m512 wv = _mm512_loadu_ps(w + i * PANEL);
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(x0[i]), wv, a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(x1[i]), wv, a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(x2[i]), wv, a2);
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(x3[i]), wv, a3);
    }
    __m512 zero = _mm512_setzero_ps();
    out[0] = _mm512_add_ps(a0, zero);
    out[1] = _mm512_add_ps(a1, zero);
    out[2] = _mm512_add_ps(a2, zero);
    out[3] = _mm512_add_ps(a3, zero);
}

/* y [m, n]: for each row of x [m, k], the logits of w (its panels; screened through packed, qsums and l1, as
 * screen_pack laid them out, with the rows' scales and magnitudes row_l1 |w_r|_1) that can hold the row's
 * largest, in float32 as gemm_panels computes them; -infinity elsewhere. Scratch: xq [m, k rounded up to 4]
 * bytes, steps [m, screen_blocks(k)], info [m * 2] and tops [threads, m, 16] floats. */
__attribute__((target("avx512f,avx512bw,avx512vnni,fma"))) void screened_logits_rows(
    const float *x, int64_t m, int64_t k, const float *panels, int64_t n, const int8_t *packed, const float *scales,
    const int32_t *qsums, const float *l1, const float *row_l1, float *y, uint8_t *xq, float *steps, float *info,
    float *tops, int threads) {
    int64_t k4 = (k + 3) / 4 * 4, groups = (n + SCREEN - 1) / SCREEN, blocks = screen_blocks(k);
    ScreenInput *in = (ScreenInput *)info;
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        int thread = omp_get_thread_num(), nthreads = omp_get_num_threads();
#else
        int thread = 0, nthreads = 1;
#endif
        int64_t begin, end;
        share(m, &begin, &end);
        for (int64_t r = begin; r < end; r++) screen_quantize(x + r * k, k, xq + r * k4, steps + r * blocks, in + r);
#pragma omp barrier
        /* every estimate and its bound, and per row the best lower end so far, lane by lane */
        share(groups, &begin, &end);
        float *top = tops + (int64_t)thread * m * 16;
        for (int64_t r = 0; r < m; r++) _mm512_storeu_ps(top + r * 16, _mm512_set1_ps(-INFINITY));
        for (int64_t g = begin; g < end; g++) {
            const int8_t *group = packed + g * SCREEN * k4;
            __mmask16 mask = tail_mask(n - g * SCREEN);
            const int32_t *gq = qsums + g * blocks * SCREEN;
            const float *gl = l1 + g * blocks * SCREEN;
            const int8_t *next = g + 1 < end ? group + SCREEN * k4 : 0;
            for (int64_t r0 = 0; r0 < m; r0 += SCREEN_ROWS) {
                int rows = m - r0 < SCREEN_ROWS ? (int)(m - r0) : SCREEN_ROWS;
                float *yb = y + r0 * n + g * SCREEN, *tb = top + r0 * 16;
                const int8_t *ahead = r0 == 0 ? next : 0;
                _Static_assert(SCREEN_ROWS == 8, "a case for each row count up to SCREEN_ROWS");
                switch (rows) {  /* a copy of the loop for each row count, as in products() */
#define SCREEN_OF(R)                                                                                                  \
    case R:                                                                                                           \
        screen_block(xq + r0 * k4, k4, k, group, R, steps + r0 * blocks, blocks, scales + g * SCREEN, gq, gl,          \
                     row_l1 + g * SCREEN, in + r0, yb, n, mask, tb, ahead);                                           \
        break;
                SCREEN_OF(1) SCREEN_OF(2) SCREEN_OF(3) SCREEN_OF(4) SCREEN_OF(5) SCREEN_OF(6) SCREEN_OF(7) SCREEN_OF(8)
#undef SCREEN_OF
                }
            }
        }
#pragma omp barrier
        /* the logits that can reach their row's best lower end, in float32; -infinity for the rest */
        float best[m];
        for (int64_t r = 0; r < m; r++) {
            __m512 lanes = _mm512_loadu_ps(tops + r * 16);
            for (int t = 1; t < nthreads; t++) lanes = _mm512_max_ps(lanes, _mm512_loadu_ps(tops + (t * m + r) * 16));
            best[r] = _mm512_reduce_max_ps(lanes);
        }
        for (int64_t g = begin; g < end; g++) {
            __mmask16 mask = tail_mask(n - g * SCREEN);
            int64_t kept[4];
            __mmask16 keeps[4];
            int count = 0;
            for (int64_t r = 0; r < m; r++) {
                float *yr = y + r * n + g * SCREEN;
                __mmask16 keep = _mm512_mask_cmp_ps_mask(mask, _mm512_maskz_loadu_ps(mask, yr),
                                                         _mm512_set1_ps(best[r]), _CMP_GE_OQ);
                _mm512_mask_storeu_ps(yr, mask, _mm512_set1_ps(-INFINITY));
                if (keep) {
                    kept[count] = r;
                    keeps[count++] = keep;
                }
                if (count == 4 || (count && r + 1 == m)) {
                    __m512 exact[4];
                    exact_logits(x, k, panels, g, kept, count, exact);
                    for (int c = 0; c < count; c++)
                        _mm512_mask_storeu_ps(y + kept[c] * n + g * SCREEN, keeps[c], exact[c]);
                    count = 0;
                }
            }
        }
    }
}
