// Paged decode attention on the CPU: one query token per sequence, K/V read in place from the
// paged cache [num_blocks, block_size, num_kv_heads, head_dim] through the block tables.
//
// Why this shape (decode attention is memory-bound: about 0.25 flop per byte of K/V in fp32):
// * one pass over K/V with an online softmax (Milakov & Gimelshein 2018, "Online normalizer
//   calculation for softmax"; the FlashAttention recurrence, Dao et al. 2022): each K/V byte is
//   read once, nothing K/V-sized is written;
// * a task is (sequence, a run of kv heads), and every query head of a kv head's group is
//   processed with it (GQA), so a K/V row is read once for the whole group;
// * when the batch alone gives the threads enough tasks, a task spans all kv heads, so it
//   streams each block as one contiguous region (block_size * kv_heads * head_dim elements);
// * scores are computed for a chunk of up to CHUNK tokens, then the softmax state is rescaled
//   once per chunk, not once per token.
//
// The only allocations are per-thread scratch buffers of O(heads_per_task * group * head_dim)
// floats, independent of the context length. Plain C ABI, loaded with ctypes: no Python or
// torch headers, so the build takes seconds.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

namespace {

constexpr int64_t CHUNK = 16;  // tokens scored before one softmax rescale
static_assert(CHUNK % 8 == 0, "the softmax works on whole 8-lane vectors");

inline float to_float(float x) { return x; }
inline float to_float(uint16_t bits) {  // bfloat16 is the top half of a float32
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline void store(float* dst, float x) { *dst = x; }
inline void store(uint16_t* dst, float x) {  // round to nearest even, as torch does (no NaN here)
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  *dst = static_cast<uint16_t>(u >> 16);
}

// 8 float lanes through GCC/Clang vector extensions: AVX2 registers with -march=native on
// x86-64, lowered to whatever the target has elsewhere. memcpy loads: rows need no alignment.
typedef float v8 __attribute__((vector_size(32)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));

inline v8 load8(const float* p) {
  v8 x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
inline v8 load8(const uint16_t* p) {
  v8u16 h;
  std::memcpy(&h, p, sizeof h);
  v8u32 u = __builtin_convertvector(h, v8u32) << 16;
  v8 x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// q . k over d elements: four independent accumulators hide the FMA latency
template <typename T>
inline float dot(const float* q, const T* k, int64_t d) {
  v8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t i = 0;
  for (; i + 32 <= d; i += 32) {
    a0 += load8(q + i) * load8(k + i);
    a1 += load8(q + i + 8) * load8(k + i + 8);
    a2 += load8(q + i + 16) * load8(k + i + 16);
    a3 += load8(q + i + 24) * load8(k + i + 24);
  }
  for (; i + 8 <= d; i += 8) a0 += load8(q + i) * load8(k + i);
  const v8 a = (a0 + a1) + (a2 + a3);
  float s = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
  for (; i < d; ++i) s += q[i] * to_float(k[i]);
  return s;
}

// acc += p * v over d elements
template <typename T>
inline void axpy(float* acc, float p, const T* v, int64_t d) {
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    v8 a = load8(acc + i) + p * load8(v + i);
    std::memcpy(acc + i, &a, sizeof a);
  }
  for (; i < d; ++i) acc[i] += p * to_float(v[i]);
}

// The same two for a GQA group: up to GROUP_STEP query rows (``nq``, contiguous, ``d`` apart)
// against one K (or V) row, each 8-lane slice of the row loaded once for all of them.
constexpr int64_t GROUP_STEP = 4;

template <typename T>
inline void dot_rows(const float* q, int64_t nq, const T* k, int64_t d, float* out) {
  v8 a[GROUP_STEP] = {};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const v8 kv = load8(k + i);
    for (int64_t j = 0; j < nq; ++j) a[j] += load8(q + j * d + i) * kv;
  }
  for (int64_t j = 0; j < nq; ++j) {
    const v8 x = a[j];
    float s = ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
    for (int64_t t = i; t < d; ++t) s += q[j * d + t] * to_float(k[t]);
    out[j] = s;
  }
}

template <typename T>
inline void axpy_rows(float* acc, int64_t nq, const float* p, const T* v, int64_t d) {
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const v8 vv = load8(v + i);
    for (int64_t j = 0; j < nq; ++j) {
      v8 a = load8(acc + j * d + i) + p[j] * vv;
      std::memcpy(acc + j * d + i, &a, sizeof a);
    }
  }
  for (int64_t j = 0; j < nq; ++j)
    for (int64_t t = i; t < d; ++t) acc[j * d + t] += p[j] * to_float(v[t]);
}

// exp of 8 lanes, x <= 0 (scores minus their running max). Range reduction x = n ln2 + r,
// |r| <= ln2 / 2, then the degree-6 polynomial of Cephes' expf (S. L. Moshier, Cephes Math
// Library, 1984-2000), about 1 ulp; 2^n goes straight into the exponent field.
inline v8 exp8(v8 x) {
  const v8 lo = v8{} - 87.0f;  // e^-87 ~ 1.6e-38: still a normal float, 0 next to a sum >= 1
  const v8 hi = v8{};          // lanes past a chunk's end hold stale values: keep them in range
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const v8 y = x * 1.44269504088896341f - 0.5f;  // y <= -0.5: truncation = round(x log2 e)
  const v8u32 n = (v8u32)__builtin_convertvector(y, __attribute__((vector_size(32))) int32_t);
  const v8 nf = __builtin_convertvector((__attribute__((vector_size(32))) int32_t)n, v8);
  const v8 r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;
  v8 p = 1.9875691500e-4f * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const v8u32 bits = (n + 127u) << 23;
  v8 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

template <typename T>
void decode(const T* q, const T* kc, const T* vc, T* out, const int32_t* tables,
            int64_t table_stride, const int32_t* ctx, int64_t batch, int64_t kv_heads,
            int64_t group, int64_t d, int64_t block_size, float scale, int64_t heads_per_task,
            int nthreads) {
  const int64_t heads = kv_heads * group;
  const int64_t chunks = (kv_heads + heads_per_task - 1) / heads_per_task;
  const int64_t tasks = batch * chunks;
  const int64_t token_stride = kv_heads * d;          // elements between consecutive tokens
  const int64_t block_stride = block_size * token_stride;

#pragma omp parallel num_threads(nthreads)
  {
    // per-thread scratch, sized by the task's heads, never by the context
    const int64_t rows = heads_per_task * group;  // query rows of one task
    std::vector<float> qf(rows * d), acc(rows * d), scores(rows * CHUNK);
    std::vector<float> m(rows), l(rows);

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / chunks;
      const int64_t h0 = (task % chunks) * heads_per_task;
      const int64_t nh = std::min(heads_per_task, kv_heads - h0);
      const int64_t nrows = nh * group;
      const T* qb = q + (b * heads + h0 * group) * d;  // the task's query rows are contiguous
      for (int64_t r = 0; r < nrows; ++r) {
        for (int64_t i = 0; i < d; ++i) qf[r * d + i] = to_float(qb[r * d + i]) * scale;
        m[r] = -INFINITY;
        l[r] = 0.0f;
      }
      std::fill(acc.begin(), acc.begin() + nrows * d, 0.0f);

      const int64_t len = ctx[b];
      const int32_t* table = tables + b * table_stride;
      for (int64_t start = 0; start < len; start += block_size) {
        const int64_t blk = table[start / block_size];
        const int64_t in_block = std::min(block_size, len - start);
        const T* kblk = kc + blk * block_stride + h0 * d;
        const T* vblk = vc + blk * block_stride + h0 * d;
        for (int64_t t0 = 0; t0 < in_block; t0 += CHUNK) {
          const int64_t n = std::min(CHUNK, in_block - t0);
          // scores[r][t] for the chunk, K rows in memory order
          for (int64_t t = 0; t < n; ++t) {
            const T* krow = kblk + (t0 + t) * token_stride;
            for (int64_t h = 0; h < nh; ++h) {
              if (group == 1) {
                scores[h * CHUNK + t] = dot(&qf[h * d], krow + h * d, d);
                continue;
              }
              for (int64_t g = 0; g < group; g += GROUP_STEP) {
                const int64_t r = h * group + g, nq = std::min(GROUP_STEP, group - g);
                float s[GROUP_STEP];
                dot_rows(&qf[r * d], nq, krow + h * d, d, s);
                for (int64_t j = 0; j < nq; ++j) scores[(r + j) * CHUNK + t] = s[j];
              }
            }
          }
          // online softmax: rescale each row's state once per chunk
          for (int64_t r = 0; r < nrows; ++r) {
            float* s = &scores[r * CHUNK];
            float mx = m[r];
            for (int64_t t = 0; t < n; ++t) mx = std::max(mx, s[t]);
            const float alpha = std::exp(m[r] - mx);  // exp(-inf) = 0 on the first chunk
            for (int64_t t = 0; t < CHUNK; t += 8) {  // whole lanes; lanes past n are unused
              v8 e = exp8(load8(s + t) - mx);
              std::memcpy(s + t, &e, sizeof e);
            }
            float sum = 0.0f;
            for (int64_t t = 0; t < n; ++t) sum += s[t];
            l[r] = l[r] * alpha + sum;
            m[r] = mx;
            if (alpha != 1.0f) {
              float* a = &acc[r * d];
              for (int64_t i = 0; i < d; ++i) a[i] *= alpha;
            }
          }
          // acc += p * V, V rows in memory order
          for (int64_t t = 0; t < n; ++t) {
            const T* vrow = vblk + (t0 + t) * token_stride;
            for (int64_t h = 0; h < nh; ++h) {
              if (group == 1) {
                axpy(&acc[h * d], scores[h * CHUNK + t], vrow + h * d, d);
                continue;
              }
              for (int64_t g = 0; g < group; g += GROUP_STEP) {
                const int64_t r = h * group + g, nq = std::min(GROUP_STEP, group - g);
                float p[GROUP_STEP];
                for (int64_t j = 0; j < nq; ++j) p[j] = scores[(r + j) * CHUNK + t];
                axpy_rows(&acc[r * d], nq, p, vrow + h * d, d);
              }
            }
          }
        }
      }
      T* ob = out + (b * heads + h0 * group) * d;
      for (int64_t r = 0; r < nrows; ++r) {
        const float inv = 1.0f / l[r];
        for (int64_t i = 0; i < d; ++i) store(&ob[r * d + i], acc[r * d + i] * inv);
      }
    }
  }
}

}  // namespace

extern "C" {

int pagedkv_abi_version() { return 1; }

void pagedkv_decode_f32(const float* q, const float* kc, const float* vc, float* out,
                        const int32_t* tables, int64_t table_stride, const int32_t* ctx,
                        int64_t batch, int64_t kv_heads, int64_t group, int64_t d,
                        int64_t block_size, float scale, int64_t heads_per_task, int nthreads) {
  decode(q, kc, vc, out, tables, table_stride, ctx, batch, kv_heads, group, d, block_size, scale,
         heads_per_task, nthreads);
}

void pagedkv_decode_bf16(const uint16_t* q, const uint16_t* kc, const uint16_t* vc, uint16_t* out,
                         const int32_t* tables, int64_t table_stride, const int32_t* ctx,
                         int64_t batch, int64_t kv_heads, int64_t group, int64_t d,
                         int64_t block_size, float scale, int64_t heads_per_task, int nthreads) {
  decode(q, kc, vc, out, tables, table_stride, ctx, batch, kv_heads, group, d, block_size, scale,
         heads_per_task, nthreads);
}

}  // extern "C"
