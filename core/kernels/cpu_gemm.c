/* y = x w^T (+ bias) in float32 on an x86-64 CPU with AVX-512: every float32 linear of a CPU engine.
 *
 * Why it exists: a decode step of a few dozen requests multiplies a few dozen rows by every weight. oneDNN's
 * packed GEMM ran those at about half of this CPU's float32 matmul rate (SmolLM2-135M's linears and LM head at
 * 32 rows: 52 ms a step on a 2-vCPU AVX-512 Xeon; this kernel 34 ms), and torch's BLAS was slower still from 48
 * to 256 rows. The shape is the textbook one: the weight is packed once into panels of PANEL output features,
 * k-major, so that for each input feature a panel's PANEL weights are three contiguous 64-byte vectors; a block
 * of ROWS input rows is multiplied against a whole panel with ROWS x 3 vector accumulators (24 of the 32
 * registers), the input values broadcast one at a time. A panel is read from memory once per chunk of rows and
 * from the L2 cache for the chunk's other blocks; while a panel is in use, the next one is prefetched at the pace
 * the work consumes it (without the prefetch the same products took 52 ms, not 34: the hardware prefetcher does
 * not run far enough ahead of a stream this fast). The threads split the panels, so each streams its own
 * stretch of the weight and writes its own columns of y: no barrier inside a product.
 *
 * Each output is one sum over k in order (one accumulator, fused multiply-adds), whatever the number of rows:
 * a request's products do not depend on which other requests share its batch. The order differs from torch's
 * BLAS, so results are close to F.linear's (float32 rounding), not bit-identical.
 *
 * Panel layout: panels[p][i][j] = w[p * PANEL + j][i] for output feature p * PANEL + j and input feature i, zero
 * past the last output feature.
 */
#include <immintrin.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define PANEL 48       /* output features per panel: three 16-float vectors */
#define ROWS 8         /* input rows per block: 8 x 3 accumulators */
#define CHUNK_BYTES (128 * 1024) /* a chunk of rows' inputs, kept in L2 while every panel passes over it */
#define MAX_CHUNK 128

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
        if (pf->next) _mm_prefetch(pf->next + pf->done * 64, _MM_HINT_T0);
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

/* This thread's panels [begin, end) of `count`: contiguous stretches, as even as they divide. */
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

/* y [m, n] = x [m, k] w^T + bias (bias may be NULL), w given as pack_panels made it. */
__attribute__((target("avx512f,fma"))) void gemm_panels(const float *x, int64_t m, int64_t k, const float *panels,
                                                         int64_t n, const float *bias, float *y, int threads) {
    int64_t count = (n + PANEL - 1) / PANEL;
    int64_t chunk = k > 0 ? CHUNK_BYTES / (4 * k) / ROWS * ROWS : MAX_CHUNK;
    chunk = chunk < ROWS ? ROWS : chunk > MAX_CHUNK ? MAX_CHUNK : chunk;
#pragma omp parallel num_threads(threads)
    {
        int64_t begin, end;
        share(count, &begin, &end);
        for (int64_t m0 = 0; m0 < m; m0 += chunk) {
            int64_t rows = m - m0 < chunk ? m - m0 : chunk, blocks = (rows + ROWS - 1) / ROWS;
            for (int64_t p = begin; p < end; p++) {
                const float *panel = panels + p * k * PANEL;
                Prefetch pf = {p + 1 < end ? (const char *)(panel + k * PANEL) : 0, k * PANEL * 4 / 64, blocks * k,
                               0, 0};
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
}
