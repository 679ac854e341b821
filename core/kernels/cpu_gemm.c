/* y = x w^T (+ bias) in float32 on an x86-64 CPU with AVX-512: every float32 linear of a CPU engine.
 *
 * Why it exists: a decode step of a few dozen requests multiplies a few dozen rows by every weight. oneDNN's
 * packed GEMM ran those well under this CPU's float32 matmul rate (SmolLM2-135M's linears and LM head at 32 rows,
 * in the forward pass's order: 62 ms a step on a 2-vCPU AVX-512 Xeon; this kernel 48 ms), and torch's BLAS was
 * slower still from 48 to 256 rows. The shape is the textbook one: the weight is packed once into panels of PANEL
 * output features, k-major, so that for each input feature a panel's PANEL weights are three contiguous 64-byte
 * vectors; a block of ROWS input rows is multiplied against a whole panel with ROWS x 3 vector accumulators (24
 * of the 32 registers), the input values broadcast one at a time. A panel is read from memory once per chunk of
 * rows and from the L2 cache for the chunk's other blocks; while a panel is in use, the next one is prefetched at
 * the pace the work consumes it (without the prefetch, one shape's products at a time took 52 ms, not 34: the
 * hardware prefetcher does not run far enough ahead of a stream this fast). The threads split the panels, so
 * each streams its own stretch of the weight and writes its own columns of y: no barrier inside a product.
 *
 * Each output is one sum over k in order (one accumulator, fused multiply-adds), whatever the number of rows:
 * a request's products do not depend on which other requests share its batch. The order differs from torch's
 * BLAS, so results are close to F.linear's (float32 rounding), not bit-identical.
 *
 * Panel layout: panels[p][i][j] = w[p * PANEL + j][i] for output feature p * PANEL + j and input feature i, zero
 * past the last output feature.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define PANEL 48       /* output features per panel: three 16-float vectors */
#define ROWS 8         /* input rows per block: 8 x 3 accumulators */
/* A chunk of rows' inputs, kept in L2 while every panel passes over it: every panel is read from memory once per
 * chunk. 128 KB made chunks of 16 rows for SmolLM2's down projection (1,536 inputs), so at 32 rows its weights
 * were read twice (at 512 rows 32 times): 512 KB makes 80-row chunks there. On a 2-vCPU AVX-512 Xeon, SmolLM2's
 * 30 layers of linears at 32 rows took 36 ms instead of 42, the `cpu` workload about 3% less time. */
#define CHUNK_BYTES (512 * 1024)
#define MAX_CHUNK 128
/* Beside the paced T0 prefetch of the next panel, the same stream FAR_AHEAD bytes further on into L2 (T1): SmolLM2's
 * linears of 60 layers (806 MB, from memory) on a 2-vCPU AMX Xeon, alternated builds: 2 rows 42.4-49.8 -> 36.3-36.4
 * ms, 8 rows 47.2-51.1 -> 41.8-45.6, 16 rows 59.9-64.4 -> 54.9, 32 rows 69.6-74.6 -> 68.0-68.6 (64 KB: worse). */
#define FAR_AHEAD 16384

int64_t panel_floats(int64_t n, int64_t k) { return (n + PANEL - 1) / PANEL * PANEL * k; }

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

/* Rows [0, rows) of x (row stride k) against one panel, into y's columns [0, cols) (row stride ldy), + bias.
 * Inlined with a constant `rows` for full blocks, so the accumulators stay in registers. */
__attribute__((target("avx512f,fma"), always_inline)) static inline void block(
    const float *x, int64_t k, const float *panel, int rows, const float *bias, float *y, int64_t ldy, int cols,
    Prefetch *pf) {
    __m512 acc[ROWS][3];
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < 3; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i++) {
        const float *w = panel + i * PANEL;
        __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(w + 32);
        prefetch_tick(pf);
        for (int r = 0; r < ROWS; r++) {
            if (r < rows) {
                __m512 xv = _mm512_set1_ps(x[r * k + i]);
                acc[r][0] = _mm512_fmadd_ps(xv, w0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(xv, w1, acc[r][1]);
                acc[r][2] = _mm512_fmadd_ps(xv, w2, acc[r][2]);
            }
        }
    }
    __mmask16 mask[3];
    for (int v = 0; v < 3; v++) {
        int left = cols - 16 * v;
        mask[v] = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
    }
    for (int v = 0; v < 3; v++) {
        __m512 b = bias ? _mm512_maskz_loadu_ps(mask[v], bias + 16 * v) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++)
            _mm512_mask_storeu_ps(y + r * ldy + 16 * v, mask[v], _mm512_add_ps(acc[r][v], b));
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

/* This thread's share of the products: its panels, against every row of x, chunk by chunk of rows. */
__attribute__((target("avx512f,fma"))) static void products(const float *x, int64_t m, int64_t k,
                                                             const float *panels, int64_t n, const float *bias,
                                                             float *y) {
    int64_t count = (n + PANEL - 1) / PANEL, begin, end;
    int64_t chunk = k > 0 ? CHUNK_BYTES / (4 * k) / ROWS * ROWS : MAX_CHUNK;
    chunk = chunk < ROWS ? ROWS : chunk > MAX_CHUNK ? MAX_CHUNK : chunk;
    share(count, &begin, &end);
    for (int64_t m0 = 0; m0 < m; m0 += chunk) {
        int64_t rows = m - m0 < chunk ? m - m0 : chunk, blocks = (rows + ROWS - 1) / ROWS;
        for (int64_t p = begin; p < end; p++) {
            const float *panel = panels + p * k * PANEL;
            Prefetch pf = {p + 1 < end ? (const char *)(panel + k * PANEL) : 0, k * PANEL * 4 / 64, blocks * k, 0, 0};
            int cols = n - p * PANEL < PANEL ? (int)(n - p * PANEL) : PANEL;
            const float *b = bias ? bias + p * PANEL : 0;
            for (int64_t blk = 0; blk < blocks; blk++) {
                const float *xb = x + (m0 + blk * ROWS) * k;
                float *yb = y + (m0 + blk * ROWS) * n + p * PANEL;
                int64_t left = rows - blk * ROWS;
                if (left >= ROWS)
                    block(xb, k, panel, ROWS, b, yb, n, cols, &pf);
                else
                    block(xb, k, panel, (int)left, b, yb, n, cols, &pf);
            }
        }
    }
}

/* y [m, n] = x [m, k] w^T + bias (bias may be NULL), w given as pack_panels made it. */
__attribute__((target("avx512f,fma"))) void gemm_panels(const float *x, int64_t m, int64_t k, const float *panels,
                                                         int64_t n, const float *bias, float *y, int threads) {
#pragma omp parallel num_threads(threads)
    products(x, m, k, panels, n, bias, y);
}

/* The products can start from work on their input's rows, done first by the same threads (rows shared out, one
 * barrier): at a decode step's few rows that is one call where torch ran eight small ops for a norm, each with
 * its own dispatch and threads. Whatever the rows, the prologue's floats are what torch's ops compute, up to the
 * order of a norm's sum and the exponential's last bit. */

static inline __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

/* e^x for sixteen floats (Cephes' expf, as cpu_decode.c's exp8: x = n ln 2 + r, a polynomial for e^r, n added
 * into the exponent's bits), with x clamped to [-87.3, 88.3], where e^x is a normal float. */
__attribute__((target("avx512f,fma"))) static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
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
                                                              int64_t k, const float *panels, int64_t n,
                                                              const float *bias, float *normed, float *sum, float *y,
                                                              int threads) {
#pragma omp parallel num_threads(threads)
    {
        int64_t begin, end;
        share(m, &begin, &end);
        norm_rows(x, residual, sum, norm_weight, begin, end, k, eps, normed);
#pragma omp barrier
        products(normed, m, k, panels, n, bias, y);
    }
}

/* y = (silu(gate) * up) w^T for gate_up [m, 2k], with act [m, k] the caller's buffer. */
__attribute__((target("avx512f,fma"))) void silu_mul_gemm_panels(const float *gate_up, int64_t m, int64_t k,
                                                                  const float *panels, int64_t n, float *act,
                                                                  float *y, int threads) {
#pragma omp parallel num_threads(threads)
    {
        int64_t begin, end;
        share(m, &begin, &end);
        silu_mul_rows(gate_up, begin, end, k, act);
#pragma omp barrier
        products(act, m, k, panels, n, 0, y);
    }
}
