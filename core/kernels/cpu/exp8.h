/* e^x for eight floats at once, shared by the C decode step (decode.c: softmax) and the C GEMM (gemm.c: SiLU).
 *
 * Cephes' expf: x = n ln 2 + r with |r| <= ln 2 / 2, a degree-7 polynomial for e^r, the exponent n added into the
 * float's bits; within about one unit in the last place. x is clamped above at 88.3, where e^x is still a normal
 * float (e^-g of a SiLU's very negative g), and the result is 0 below -87.3, where e^x leaves the normal floats.
 * Needs AVX2 and FMA: both files are built with -mavx2 -mfma. */
#ifndef MINISGL_EXP8_H
#define MINISGL_EXP8_H

#include <immintrin.h>

static inline __m256 exp8(__m256 x) {
    const __m256 lowest = _mm256_set1_ps(-87.3f);
    __m256 under = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lowest), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x); /* ln 2 in two parts, for an exact r */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

#endif
