// Paged decode attention over an fp8 (e4m3) KV pool, on tensor cores, for GPUs with fp8 conversions (sm_89+).
// Built at first use by core/kernels/cuda/fp8_decode.py (nvcc), called through ctypes; the pool's layout and
// scales are core/kvcache/pool.py's, the page lists flashinfer's CSR form (core/attention/paging.py).
//
// Why CUDA and not Triton: a decode step reads each cached fp8 byte once and does about four multiply-adds
// with it, so the kernel is fast only if the bytes go from memory into the tensor cores' operand registers
// with nothing in between. Triton loads a tile in its own layout and converts it to the product's operand
// layout through shared memory, which on fp8 pages costs more than the bytes (docs/BENCHMARKS.md). Here every
// thread loads exactly the bytes its
// mma.m16n8k16 fragments need, converts them in registers (one instruction per two values) and multiplies.
//
// The trick that makes direct loads possible: a dot product does not care in which order it visits the head
// dimension, so the products' k index is mapped onto the head dimension in whatever order lets a thread read
// contiguous bytes, and the query is laid out in the same order. Two products per tile of 16 tokens:
//   scores^T [16 tokens, 8]   = K [16 tokens, D] . Q^T [D, 8]       (the query group on the narrow side)
//   out^T    [D, 8]          += V^T [D, 16 tokens] . P^T [16 tokens, 8]
// so a query group of up to 8 heads costs the same as one, and no product is padded on its wide side. The
// per-(slot, KV head) scales come out of the products: scores * k_scale, and p * v_scale before P^T.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with f16 operands; lane = 4 * g + c, g = lane / 4, c = lane % 4):
//   A [16, 16]: reg0 (row g, k 2c..2c+1), reg1 (row g+8, k 2c..), reg2 (row g, k 2c+8..), reg3 (row g+8, k 2c+8..)
//   B [16, 8]:  reg0 (k 2c..2c+1, col g), reg1 (k 2c+8..2c+9, col g)
//   C [16, 8]:  c0, c1 (row g, cols 2c, 2c+1), c2, c3 (row g+8, cols 2c, 2c+1), float32
//
// Work: one block of WARPS warps per (KV head, request, split); warp w takes the split's tiles w, w + WARPS,
// ...; the warps' online-softmax states merge through shared memory at the end. With splits > 1 each block
// writes its normalised partial and log-sum-exp, and merge_splits combines them.
//
// Two choices that keep the memory system busy (each can be turned off at build time for an A/B):
// - HEAD_MAJOR: the KV head is the grid's fastest index, so the blocks of one request's heads run side by side.
//   A slot's scales of every head share one 32-byte sector; blocks that read it at the same time read it from
//   memory once, where request-major blocks (each head's pass over the whole batch apart from the next) read a
//   whole sector for 4 bytes: 56 bytes a slot and head on top of 264.
// - PREFETCH_L2: a warp asks L2 for its next tile's rows before it computes the current one, so they come from
//   L2 rather than memory when it loads them, at no cost in registers. One tile ahead beat two or three, and
//   beat loading the next tile into registers (a pipeline of two tiles), whose registers leave room for fewer
//   blocks an SM (docs/BENCHMARKS.md).

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

namespace {

constexpr int WARPS = 4;
constexpr int TILE = 16;  // tokens per warp iteration: the products' M (scores) and K (values)
constexpr int MAX_GROUP = 8;  // query heads per KV head: the products' N
constexpr float LOG2E = 1.4426950408889634f;
#ifndef MINISGL_FP8_HEAD_MAJOR
#define MINISGL_FP8_HEAD_MAJOR 1
#endif
#ifndef MINISGL_FP8_PREFETCH_L2
#define MINISGL_FP8_PREFETCH_L2 1
#endif
constexpr bool HEAD_MAJOR = MINISGL_FP8_HEAD_MAJOR;
constexpr bool PREFETCH_L2 = MINISGL_FP8_PREFETCH_L2;

__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two_bytes) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_bytes & 0xffff), __NV_E4M3);
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The slot of token t of a request whose pages start at kv_indices + first.
__device__ __forceinline__ int64_t slot_of(const int32_t* __restrict__ kv_indices, int first, int t, int page) {
    return static_cast<int64_t>(kv_indices[first + t / page]) * page + t % page;
}

// The token range of one split: whole tiles, so only a request's last tile is partial.
__device__ __forceinline__ void split_range(int length, int split, int splits, int& lo, int& hi) {
    int tiles = (length + TILE - 1) / TILE;
    int per = (tiles + splits - 1) / splits;
    lo = min(split * per * TILE, length);
    hi = min((split + 1) * per * TILE, length);
}

// One warp's tile in registers: thread (g, c) holds K rows g and g + 8 at bytes [c * D / 4, (c + 1) * D / 4)
// (the scores' A fragments), V rows 2c, 2c + 1, 2c + 8, 2c + 9 at bytes [g * D / 8, (g + 1) * D / 8) (the
// values' A fragments), and the K and V scales of tokens g and g + 8.
template <int D>
struct TileLoad {
    uint32_t kw[2][D / 16];
    uint32_t vw[4][D / 32];
    float kscale[2], vscale[2];
};

// The slots of thread (g, c)'s rows of the tile at t0: K rows g, g + 8 and V rows 2c, 2c + 1, 2c + 8, 2c + 9.
__device__ __forceinline__ void tile_slots(int64_t (&ks)[2], int64_t (&vs)[4], int t0, int hi, bool tile_pages,
                                           const int32_t* __restrict__ kv_indices, int first, int page, int g,
                                           int c) {
    const int kt[2] = {t0 + g, t0 + g + 8};
    const int vt[4] = {t0 + 2 * c, t0 + 2 * c + 1, t0 + 2 * c + 8, t0 + 2 * c + 9};
    if (tile_pages) {
        const int64_t base = static_cast<int64_t>(kv_indices[first + t0 / page]) * page + t0 % page - t0;
#pragma unroll
        for (int i = 0; i < 2; ++i) ks[i] = base + (kt[i] < hi ? kt[i] : t0);
#pragma unroll
        for (int i = 0; i < 4; ++i) vs[i] = base + (vt[i] < hi ? vt[i] : t0);
    } else {
#pragma unroll
        for (int i = 0; i < 2; ++i) ks[i] = slot_of(kv_indices, first, kt[i] < hi ? kt[i] : t0, page);
#pragma unroll
        for (int i = 0; i < 4; ++i) vs[i] = slot_of(kv_indices, first, vt[i] < hi ? vt[i] : t0, page);
    }
}

// Issue the loads of the tile of tokens [t0, t0 + TILE) (tokens from hi on read token t0's slot: their scores
// are masked later).
template <int D>
__device__ __forceinline__ void load_tile(TileLoad<D>& r, int t0, int hi, bool tile_pages,
                                          const int32_t* __restrict__ kv_indices, int first, int page,
                                          const uint8_t* __restrict__ k_cache, const uint8_t* __restrict__ v_cache,
                                          const float* __restrict__ k_scale, const float* __restrict__ v_scale,
                                          int64_t row_bytes, int num_kv_heads, int h, int g, int c) {
    constexpr int CHUNKS = D / 16, V_WORDS = D / 32;
    int64_t ks[2], vs[4];
    tile_slots(ks, vs, t0, hi, tile_pages, kv_indices, first, page, g, c);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const uint4* src = reinterpret_cast<const uint4*>(k_cache + ks[i] * row_bytes + h * D + c * (D / 4));
#pragma unroll
        for (int u = 0; u < CHUNKS / 4; ++u) {
            uint4 x = __ldg(src + u);
            r.kw[i][4 * u] = x.x; r.kw[i][4 * u + 1] = x.y; r.kw[i][4 * u + 2] = x.z; r.kw[i][4 * u + 3] = x.w;
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint8_t* src = v_cache + vs[i] * row_bytes + h * D + g * (D / 8);
        if constexpr (V_WORDS == 4) {
            uint4 x = __ldg(reinterpret_cast<const uint4*>(src));
            r.vw[i][0] = x.x; r.vw[i][1] = x.y; r.vw[i][2] = x.z; r.vw[i][3] = x.w;
        } else {
            uint2 x = __ldg(reinterpret_cast<const uint2*>(src));
            r.vw[i][0] = x.x; r.vw[i][1] = x.y;
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        r.kscale[i] = __ldg(k_scale + ks[i] * num_kv_heads + h);
        r.vscale[i] = __ldg(v_scale + ks[i] * num_kv_heads + h);
    }
}

// Ask L2 for the rows of the tile at t0: lane r < 16 the K row of token t0 + r, lane 16 + r its V row (a head's
// row is at most one 128-byte line).
template <int D>
__device__ __forceinline__ void prefetch_tile(int t0, int hi, bool tile_pages, const int32_t* __restrict__ kv_indices,
                                              int first, int page, const uint8_t* __restrict__ k_cache,
                                              const uint8_t* __restrict__ v_cache, int64_t row_bytes, int h,
                                              int lane) {
    const int t = t0 + (lane & 15);
    if (t >= hi) return;
    const int64_t slot = tile_pages ? static_cast<int64_t>(kv_indices[first + t0 / page]) * page + t % page
                                    : slot_of(kv_indices, first, t, page);
    const uint8_t* row = (lane < 16 ? k_cache : v_cache) + slot * row_bytes + h * D;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row));
}

template <typename T, int D>
__global__ void __launch_bounds__(WARPS * 32, 4)
fp8_decode_kernel(const T* __restrict__ q, const uint8_t* __restrict__ k_cache, const uint8_t* __restrict__ v_cache,
                  const float* __restrict__ k_scale, const float* __restrict__ v_scale,
                  const int32_t* __restrict__ kv_indptr, const int32_t* __restrict__ kv_indices,
                  const int32_t* __restrict__ kv_last, T* __restrict__ out, float* __restrict__ part_o,
                  float* __restrict__ part_lse, int num_heads, int num_kv_heads, int page, int splits,
                  float sm_scale) {
    constexpr int CHUNKS = D / 16;    // k-chunks of the scores product = 32-bit words a thread reads of a K row
    constexpr int V_WORDS = D / 32;   // words a thread reads of a V row (its D / 8 dims)
    constexpr int M_TILES = D / 16;   // 16-dim tiles of the values product
    const int h = HEAD_MAJOR ? blockIdx.x : blockIdx.y, b = HEAD_MAJOR ? blockIdx.y : blockIdx.x;
    const int split = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int group = num_heads / num_kv_heads;
    const int first = kv_indptr[b];
    const int pages = kv_indptr[b + 1] - first;
    const int length = pages > 0 ? (pages - 1) * page + kv_last[b] : 0;
    int lo, hi;
    split_range(length, split, splits, lo, hi);
    const float score_scale = sm_scale * LOG2E;  // softmax in base 2
    const int64_t row_bytes = static_cast<int64_t>(num_kv_heads) * D;  // one slot's K (or V) for every head

    // the query, as B operands: thread (g, c) holds head g of the group at dims [c * D / 4, (c + 1) * D / 4)
    uint32_t qf[CHUNKS][2];
    {
        const bool real = g < group;
        const T* qrow = q + (static_cast<int64_t>(b) * num_heads + h * group + (real ? g : 0)) * D + c * (D / 4);
#pragma unroll
        for (int j = 0; j < CHUNKS; ++j) {
            float x0 = static_cast<float>(qrow[4 * j]), x1 = static_cast<float>(qrow[4 * j + 1]);
            float x2 = static_cast<float>(qrow[4 * j + 2]), x3 = static_cast<float>(qrow[4 * j + 3]);
            qf[j][0] = real ? pack_f16x2(x0, x1) : 0u;
            qf[j][1] = real ? pack_f16x2(x2, x3) : 0u;
        }
    }

    float m[2] = {-INFINITY, -INFINITY};  // running max of groups 2c, 2c+1 (base 2), the same in every g
    float l[2] = {0.f, 0.f};              // this thread's part of their sums
    float acc[M_TILES][4];
#pragma unroll
    for (int i = 0; i < M_TILES; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    const bool tile_pages = page % TILE == 0;  // a tile never crosses a page: one page lookup per tile
    constexpr int STRIDE = WARPS * TILE;
    const int t_first = lo + warp * TILE;
    for (int t0 = t_first; t0 < hi; t0 += STRIDE) {
        // every load of the tile first, so the values arrive while the scores are computed
        TileLoad<D> cur;
        load_tile(cur, t0, hi, tile_pages, kv_indices, first, page, k_cache, v_cache, k_scale, v_scale, row_bytes,
                  num_kv_heads, h, g, c);
        if (PREFETCH_L2 && t0 + STRIDE < hi) {
            prefetch_tile<D>(t0 + STRIDE, hi, tile_pages, kv_indices, first, page, k_cache, v_cache, row_bytes, h,
                             lane);
        }
        const auto& kw = cur.kw;
        const auto& vw = cur.vw;
        const auto& kscale = cur.kscale;
        const auto& vscale = cur.vscale;
        const int kt[2] = {t0 + g, t0 + g + 8};

        // scores^T: rows = tokens g, g + 8; columns = heads 2c, 2c + 1 of the group
        float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < CHUNKS; ++j) {
            mma_16816(s, e4m3x2_to_f16x2(kw[0][j]), e4m3x2_to_f16x2(kw[1][j]), e4m3x2_to_f16x2(kw[0][j] >> 16),
                      e4m3x2_to_f16x2(kw[1][j] >> 16), qf[j][0], qf[j][1]);
        }
        const bool valid0 = kt[0] < hi, valid1 = kt[1] < hi;
        s[0] = valid0 ? s[0] * kscale[0] * score_scale : -INFINITY;
        s[1] = valid0 ? s[1] * kscale[0] * score_scale : -INFINITY;
        s[2] = valid1 ? s[2] * kscale[1] * score_scale : -INFINITY;
        s[3] = valid1 ? s[3] * kscale[1] * score_scale : -INFINITY;

        // online softmax per head: the tile's max over the 16 tokens (lanes of the same c)
        float alpha[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            float mx = fmaxf(s[e], s[e + 2]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
            float m_new = fmaxf(m[e], mx);  // finite: the tile's first token is valid
            alpha[e] = exp2f(m[e] - m_new);
            m[e] = m_new;
        }
        float p[4];
        p[0] = exp2f(s[0] - m[0]);
        p[1] = exp2f(s[1] - m[1]);
        p[2] = exp2f(s[2] - m[0]);
        p[3] = exp2f(s[3] - m[1]);
        l[0] = l[0] * alpha[0] + p[0] + p[2];
        l[1] = l[1] * alpha[1] + p[1] + p[3];
#pragma unroll
        for (int i = 0; i < M_TILES; ++i) {
            acc[i][0] *= alpha[0]; acc[i][1] *= alpha[1]; acc[i][2] *= alpha[0]; acc[i][3] *= alpha[1];
        }

        // P^T as B operands: thread (g, c) needs head g at tokens 2c, 2c+1, 2c+8, 2c+9, held by lanes
        // 8c + g/2 (tokens 2c, 2c+8) and 8c + 4 + g/2 (tokens 2c+1, 2c+9), as element g % 2 of their pairs
        uint32_t x0 = pack_f16x2(p[0] * vscale[0], p[2] * vscale[1]);  // head 2c at tokens g, g + 8
        uint32_t x1 = pack_f16x2(p[1] * vscale[0], p[3] * vscale[1]);  // head 2c + 1
        const int src_even = 8 * c + g / 2, src_odd = src_even + 4;
        uint32_t e0 = __shfl_sync(0xffffffffu, x0, src_even), e1 = __shfl_sync(0xffffffffu, x1, src_even);
        uint32_t o0 = __shfl_sync(0xffffffffu, x0, src_odd), o1 = __shfl_sync(0xffffffffu, x1, src_odd);
        const uint32_t a = (g & 1) ? e1 : e0;  // (token 2c, token 2c + 8)
        const uint32_t bb = (g & 1) ? o1 : o0;  // (token 2c + 1, token 2c + 9)
        const uint32_t pb0 = __byte_perm(a, bb, 0x5410), pb1 = __byte_perm(a, bb, 0x7632);

        // out^T += V^T . P^T: m-tile i = 2w + half holds dims g * D / 8 + 4w + 2 half (+1 in rows g + 8)
#pragma unroll
        for (int w = 0; w < V_WORDS; ++w) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const uint32_t sel = half ? 0x7362 : 0x5140;
                uint32_t lo_pair = __byte_perm(vw[0][w], vw[1][w], sel);   // tokens 2c, 2c + 1
                uint32_t hi_pair = __byte_perm(vw[2][w], vw[3][w], sel);   // tokens 2c + 8, 2c + 9
                mma_16816(acc[2 * w + half], e4m3x2_to_f16x2(lo_pair), e4m3x2_to_f16x2(lo_pair >> 16),
                          e4m3x2_to_f16x2(hi_pair), e4m3x2_to_f16x2(hi_pair >> 16), pb0, pb1);
            }
        }
    }

    // the warp's sums over its 16 token rows (lanes of the same c)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        l[e] += __shfl_xor_sync(0xffffffffu, l[e], 4);
        l[e] += __shfl_xor_sync(0xffffffffu, l[e], 8);
        l[e] += __shfl_xor_sync(0xffffffffu, l[e], 16);
    }

    // merge the warps: each writes its (max, sum, unnormalised output) per head
    __shared__ float sm_o[WARPS][MAX_GROUP][D];
    __shared__ float sm_m[WARPS][MAX_GROUP], sm_l[WARPS][MAX_GROUP];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int head = 2 * c + e;
        if (head < group) {
            if (g == 0) {
                sm_m[warp][head] = m[e];
                sm_l[warp][head] = l[e];
            }
#pragma unroll
            for (int i = 0; i < M_TILES; ++i) {
                // m-tile i: dim g * D / 8 + 2i in c0 / c1 (rows g), + 1 in c2 / c3 (rows g + 8)
                sm_o[warp][head][g * (D / 8) + 2 * i] = acc[i][e];
                sm_o[warp][head][g * (D / 8) + 2 * i + 1] = acc[i][2 + e];
            }
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < group * D; idx += WARPS * 32) {
        const int head = idx / D, d = idx % D;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, sm_m[w][head]);
        float sum = 0.f, o = 0.f;
        if (mx > -INFINITY) {
#pragma unroll
            for (int w = 0; w < WARPS; ++w) {
                const float f = exp2f(sm_m[w][head] - mx);
                sum += sm_l[w][head] * f;
                o += sm_o[w][head][d] * f;
            }
        }
        const float value = sum > 0.f ? o / sum : 0.f;
        const int64_t qh = static_cast<int64_t>(b) * num_heads + h * group + head;
        if (splits == 1) {
            out[qh * D + d] = T(value);
        } else {
            const int64_t part = qh * splits + split;
            part_o[part * D + d] = value;
            if (d == 0) part_lse[part] = sum > 0.f ? mx + log2f(sum) : -INFINITY;
        }
    }
}

// Splits of one query head combined by their log-sum-exps: one block of D threads per (request, head).
template <typename T, int D>
__global__ void merge_splits(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                             T* __restrict__ out, int splits) {
    const int64_t qh = blockIdx.x;
    const int d = threadIdx.x;
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, part_lse[qh * splits + s]);
    float sum = 0.f, o = 0.f;
    if (mx > -INFINITY) {
        for (int s = 0; s < splits; ++s) {
            const float f = exp2f(part_lse[qh * splits + s] - mx);
            sum += f;
            o += part_o[(qh * splits + s) * D + d] * f;
        }
    }
    out[qh * D + d] = T(sum > 0.f ? o / sum : 0.f);
}

template <typename T, int D>
int launch(const void* q, const void* k_cache, const void* v_cache, const float* k_scale, const float* v_scale,
           const int32_t* kv_indptr, const int32_t* kv_indices, const int32_t* kv_last, void* out, float* part_o,
           float* part_lse, int batch, int num_heads, int num_kv_heads, int page, int splits, float sm_scale,
           cudaStream_t stream) {
    dim3 grid = HEAD_MAJOR ? dim3(num_kv_heads, batch, splits) : dim3(batch, num_kv_heads, splits);
    fp8_decode_kernel<T, D><<<grid, WARPS * 32, 0, stream>>>(
        static_cast<const T*>(q), static_cast<const uint8_t*>(k_cache), static_cast<const uint8_t*>(v_cache),
        k_scale, v_scale, kv_indptr, kv_indices, kv_last, static_cast<T*>(out), part_o, part_lse, num_heads,
        num_kv_heads, page, splits, sm_scale);
    if (splits > 1) {
        merge_splits<T, D><<<batch * num_heads, D, 0, stream>>>(part_o, part_lse, static_cast<T*>(out), splits);
    }
    return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" {

// q, out: [batch, num_heads, head_dim] bf16 (q_bf16 = 1) or float16; k_cache, v_cache: [slots, num_kv_heads,
// head_dim] e4m3; k_scale, v_scale: [slots, num_kv_heads] float32; part_o: [batch * num_heads * splits,
// head_dim] and part_lse: [batch * num_heads * splits] float32 (used only when splits > 1). Returns a
// cudaError_t: 0, or the launch's error. Needs head_dim 64 or 128 and at most 8 query heads per KV head.
int minisgl_fp8_decode(const void* q, const void* k_cache, const void* v_cache, const float* k_scale,
                       const float* v_scale, const int32_t* kv_indptr, const int32_t* kv_indices,
                       const int32_t* kv_last, void* out, float* part_o, float* part_lse, int batch, int num_heads,
                       int num_kv_heads, int head_dim, int page, int splits, float sm_scale, int q_bf16,
                       void* stream) {
    if (num_heads % num_kv_heads != 0 || num_heads / num_kv_heads > MAX_GROUP || splits < 1) return -1;
    if (batch > 65535 || num_kv_heads > 65535 || splits > 65535) return -1;  // the grid's y and z limits
    cudaStream_t s = static_cast<cudaStream_t>(stream);
#define MINISGL_LAUNCH(T, D)                                                                                  \
    return launch<T, D>(q, k_cache, v_cache, k_scale, v_scale, kv_indptr, kv_indices, kv_last, out, part_o, \
                        part_lse, batch, num_heads, num_kv_heads, page, splits, sm_scale, s)
    if (head_dim == 128) {
        if (q_bf16) { MINISGL_LAUNCH(__nv_bfloat16, 128); } else { MINISGL_LAUNCH(__half, 128); }
    }
    if (head_dim == 64) {
        if (q_bf16) { MINISGL_LAUNCH(__nv_bfloat16, 64); } else { MINISGL_LAUNCH(__half, 64); }
    }
#undef MINISGL_LAUNCH
    return -1;
}

}  // extern "C"
