// Paged attention on the CPU, K/V read in place from the paged cache
// [num_blocks, block_size, num_kv_heads, head_dim] through the block tables: decode (one query
// token per sequence) and prefill / chunked prefill (several, causal) in the same batch.
//
// Why this shape (decode attention is memory-bound: about 0.25 flop per byte of K/V in fp32):
// * one pass over K/V with an online softmax (Milakov & Gimelshein 2018, "Online normalizer
//   calculation for softmax"; the FlashAttention recurrence, Dao et al. 2022): each K/V byte is
//   read once per task, nothing K/V-sized is written;
// * a task is (sequence, a run of kv heads, a tile of query tokens), and every query row that
//   reads a kv head (the GQA group, times the tile's tokens) is processed with it, so a K/V row
//   is read once for all of them;
// * when the batch alone gives the threads enough tasks, a decode task spans all kv heads, so it
//   streams each block as one contiguous region (block_size * kv_heads * head_dim elements);
// * scores are computed for a chunk of CHUNK tokens (one vector of them), then the softmax state
//   is rescaled once per chunk, not once per token;
// * the widest vector unit the compiler targets: 16 float lanes with AVX-512 (``-march=native``
//   on a CPU that has it), else 8 lanes through GCC/Clang vector extensions (AVX2 on x86-64,
//   whatever the target has elsewhere).
//
// Causality: query token j of a sequence with context c and q query tokens sits at position
// p = c - q + j and sees keys 0..p; with a sliding window w (Mistral), only keys p - w < k <= p.
// A row skips a chunk holding none of its keys (its softmax state unchanged), and its running
// max stays -inf until its first visible key: exp(-inf - max) = 0 rescales nothing.
//
// The only allocations are per-thread scratch buffers of O(rows_per_task * head_dim) floats and
// a task list of one entry per (sequence, head run, tile): independent of the context length.
// Plain C ABI, loaded with ctypes: no Python or torch headers, so the build takes seconds.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

#if defined(__AVX512F__)
constexpr int64_t W = 16;  // float lanes per vector
#else
constexpr int64_t W = 8;
#endif
typedef float vf __attribute__((vector_size(4 * W)));
typedef int32_t vi __attribute__((vector_size(4 * W)));
typedef uint32_t vu __attribute__((vector_size(4 * W)));
typedef uint16_t vh __attribute__((vector_size(2 * W)));

constexpr int64_t CHUNK = 16;  // key tokens scored before one softmax rescale
static_assert(CHUNK % W == 0, "the softmax works on whole vectors");
constexpr int64_t ROW_STEP = 4;   // query rows sharing one load of a V slice
constexpr int64_t TILE_ROWS = 64;  // query rows of a prefill task (tokens x group x heads)

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

// memcpy loads and stores: rows need no alignment
inline vf vload(const float* p) {
  vf x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
inline vf vload(const uint16_t* p) {  // bfloat16 -> float32: widen, shift into the top half
#if defined(__AVX512F__)
  // one vpmovzxwd: GCC's generic conversion is split in halves under 256-bit tuning
  const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
#else
  vh h;
  std::memcpy(&h, p, sizeof h);
  const vu u = __builtin_convertvector(h, vu) << 16;
  vf x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}
inline void vstore(float* p, vf x) { std::memcpy(p, &x, sizeof x); }

inline float vsum(vf x) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(x);
#else
  float s = 0.0f;
  for (int64_t i = 0; i < W / 2; ++i) s += x[i] + x[i + W / 2];
  return s;
#endif
}

// Horizontal sums of CHUNK = 16 vectors at once: lane t of the result is the sum of part[t]'s
// lanes. A transpose-and-add tree (about 3 shuffles and adds per vector instead of 8).
#if defined(__AVX512F__)
static_assert(CHUNK == W, "sum16 turns a chunk of partial sums into one vector of scores");
inline vf sum16(const vf* part) {
  __m512 s1[8], s2[4], s3[2];
  for (int k = 0; k < 8; ++k) {  // per 128-bit lane: [a, b, a, b] partials of tokens 2k, 2k+1
    const __m512 a = part[2 * k], b = part[2 * k + 1];
    s1[k] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  }
  for (int k = 0; k < 4; ++k) {  // per 128-bit lane: tokens 4k .. 4k+3
    const __m512d c = _mm512_castps_pd(s1[2 * k]), e = _mm512_castps_pd(s1[2 * k + 1]);
    s2[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c, e)),
                          _mm512_castpd_ps(_mm512_unpackhi_pd(c, e)));
  }
  for (int k = 0; k < 2; ++k)  // 128-bit lanes summed in pairs
    s3[k] = _mm512_add_ps(_mm512_shuffle_f32x4(s2[2 * k], s2[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_f32x4(s2[2 * k], s2[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s3[0], s3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(s3[0], s3[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

// The scores of one query row (``q``, already scaled) against the CHUNK K rows ``krows`` (at
// ``off``) into ``out``: the row's slice is loaded once per slice of the 16 keys, 16
// independent accumulators hide the FMA latency, then one sum16.
template <typename T>
inline void scores_row(const float* q, const T* const* krows, int64_t off, int64_t d,
                       float* out) {
  vf part[CHUNK] = {};
  int64_t i = 0;
  for (; i + W <= d; i += W) {
    const vf x = vload(q + i);
    for (int64_t t = 0; t < CHUNK; ++t) part[t] += x * vload(krows[t] + off + i);
  }
#if defined(__AVX512F__)
  vstore(out, sum16(part));
#else
  for (int64_t t = 0; t < CHUNK; ++t) out[t] = vsum(part[t]);
#endif
  for (; i < d; ++i)
    for (int64_t t = 0; t < CHUNK; ++t) out[t] += q[i] * to_float(krows[t][off + i]);
}

// acc[j] += sum_t p[j][t] v_t over the n rows ``vrows`` (at ``off``), for NQ accumulator rows
// (``d`` apart; their weights ``CHUNK`` apart): each slice of the accumulators stays in
// registers across the tokens, each slice of a V row is loaded once for the NQ rows.
template <int NQ, typename T>
inline void pv_rows(float* acc, const float* p, const T* const* vrows, int64_t n, int64_t off,
                    int64_t d) {
  int64_t i = 0;
  for (; i + W <= d; i += W) {
    vf a[NQ];
    for (int j = 0; j < NQ; ++j) a[j] = vload(acc + j * d + i);
    for (int64_t t = 0; t < n; ++t) {
      const vf x = vload(vrows[t] + off + i);
      for (int j = 0; j < NQ; ++j) a[j] += p[j * CHUNK + t] * x;
    }
    for (int j = 0; j < NQ; ++j) vstore(acc + j * d + i, a[j]);
  }
  for (; i < d; ++i)
    for (int64_t t = 0; t < n; ++t) {
      const float x = to_float(vrows[t][off + i]);
      for (int j = 0; j < NQ; ++j) acc[j * d + i] += p[j * CHUNK + t] * x;
    }
}

// pv_rows for nq = 1 .. ROW_STEP rows
template <typename T>
inline void pv_n(float* acc, int64_t nq, const float* p, const T* const* vrows, int64_t n,
                 int64_t off, int64_t d) {
  switch (nq) {
    case 1: return pv_rows<1>(acc, p, vrows, n, off, d);
    case 2: return pv_rows<2>(acc, p, vrows, n, off, d);
    case 3: return pv_rows<3>(acc, p, vrows, n, off, d);
    default: return pv_rows<4>(acc, p, vrows, n, off, d);
  }
}
static_assert(ROW_STEP == 4, "pv_n dispatches 1 .. 4 rows");

inline vi iota() {
  vi x;
  for (int64_t i = 0; i < W; ++i) x[i] = static_cast<int32_t>(i);
  return x;
}

// exp of W lanes, x <= 0 (scores minus their running max). Range reduction x = n ln2 + r,
// |r| <= ln2 / 2, then the degree-6 polynomial of Cephes' expf (S. L. Moshier, Cephes Math
// Library, 1984-2000), about 1 ulp; 2^n goes straight into the exponent field.
inline vf vexp(vf x) {
  const vf lo = vf{} - 87.0f;  // e^-87 ~ 1.6e-38: still a normal float, 0 next to a sum >= 1
  const vf hi = vf{};          // lanes past a chunk's end hold stale values: keep them in range
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const vf y = x * 1.44269504088896341f - 0.5f;  // y <= -0.5: truncation = round(x log2 e)
  const vi n = __builtin_convertvector(y, vi);
  const vf nf = __builtin_convertvector(n, vf);
  const vf r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;
  vf p = 1.9875691500e-4f * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const vu bits = ((vu)n + 127u) << 23;
  vf scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

struct Shape {
  int64_t kv_heads, group, d, block_size;
  int64_t heads() const { return kv_heads * group; }
  int64_t token_stride() const { return kv_heads * d; }  // elements between cached tokens
  int64_t block_stride() const { return block_size * token_stride(); }
};

struct Task {
  int64_t seq, h0, nh, j0, nj;  // sequence, kv heads [h0, h0 + nh), query tokens [j0, j0 + nj)
};

// Scratch of one thread, sized for the largest task: query rows (scaled, float), accumulators,
// a chunk of scores per row, the softmax state per row.
struct Scratch {
  std::vector<float> q, acc, scores, m, l;
  explicit Scratch(int64_t rows, int64_t d)
      : q(rows * d), acc(rows * d), scores(rows * CHUNK), m(rows), l(rows) {}
};

// One task. Rows are ordered (kv head, query token, group member), so the rows reading kv head
// h and seeing key position kp (query tokens with position >= kp) are one contiguous run.
template <typename T>
void run_task(const Task& task, const T* q, const T* kc, const T* vc, T* out,
              const int32_t* table, int64_t ctx, int64_t q_first, int64_t qlen, const Shape& s,
              float scale, int64_t window, Scratch& w) {
  const int64_t d = s.d, g = s.group, nj = task.nj, per_head = nj * g, nrows = task.nh * per_head;
  const int64_t first_pos = ctx - qlen + task.j0;  // the tile's first query position
  for (int64_t hl = 0; hl < task.nh; ++hl)
    for (int64_t j = 0; j < nj; ++j) {
      const T* src = q + ((q_first + task.j0 + j) * s.heads() + (task.h0 + hl) * g) * d;
      float* dst = &w.q[(hl * per_head + j * g) * d];
      for (int64_t i = 0; i < g * d; ++i) dst[i] = to_float(src[i]) * scale;
    }
  std::fill(w.acc.begin(), w.acc.begin() + nrows * d, 0.0f);
  std::fill(w.m.begin(), w.m.begin() + nrows, -INFINITY);
  std::fill(w.l.begin(), w.l.begin() + nrows, 0.0f);

  // keys [lo, end) are visible to some row of the tile
  const int64_t end = first_pos + nj, lo = std::max<int64_t>(0, first_pos - window + 1);
  for (int64_t start = lo; start < end; start += CHUNK) {
    const int64_t n = std::min(CHUNK, end - start);
    // scores[r][t] of the chunk; past its end (the last chunk), repeats of its first key
    const T* krows[CHUNK];
    const T* vrows[CHUNK];
    for (int64_t t = 0; t < CHUNK; ++t) {
      const int64_t kp = start + (t < n ? t : 0);
      const int64_t at = table[kp / s.block_size] * s.block_stride() +
                         (kp % s.block_size) * s.token_stride() + task.h0 * d;
      krows[t] = kc + at;
      vrows[t] = vc + at;
    }
    for (int64_t hl = 0; hl < task.nh; ++hl)
      for (int64_t r = hl * per_head; r < (hl + 1) * per_head; ++r)
        scores_row(&w.q[r * d], krows, hl * d, d, &w.scores[r * CHUNK]);
    // online softmax: each row's state is rescaled once per chunk; invisible keys weigh 0
    for (int64_t r = 0; r < nrows; ++r) {
      const int64_t pos = first_pos + (r % per_head) / g;
      // the row's keys in the chunk: lanes [first, visible)
      const int64_t first = std::max<int64_t>(0, pos - window + 1 - start);
      const int64_t visible = std::min(n, pos + 1 - start);
      float* sc = &w.scores[r * CHUNK];
      if (visible <= first) {  // none of its keys in the chunk: weights 0, state unchanged
        std::fill(sc, sc + CHUNK, 0.0f);
        continue;
      }
      float mx = w.m[r];
      for (int64_t t = first; t < visible; ++t) mx = std::max(mx, sc[t]);
      const float alpha = std::exp(w.m[r] - mx);  // exp(-inf) = 0 before its first key
      float sum = 0.0f;
      for (int64_t t = 0; t < CHUNK; t += W) {
        const vi lane = iota() + static_cast<int32_t>(t);
        const vf e = (lane >= static_cast<int32_t>(first)) & (lane < static_cast<int32_t>(visible))
                         ? vexp(vload(sc + t) - mx)
                         : vf{};
        sum += vsum(e);
        vstore(sc + t, e);
      }
      w.l[r] = w.l[r] * alpha + sum;
      w.m[r] = mx;
      if (alpha != 1.0f) {
        float* a = &w.acc[r * d];
        for (int64_t i = 0; i < d; ++i) a[i] *= alpha;
      }
    }
    // acc += P V over the chunk (invisible keys have p = 0)
    for (int64_t hl = 0; hl < task.nh; ++hl) {
      const int64_t base = hl * per_head;
      for (int64_t r = base; r < base + per_head; r += ROW_STEP) {
        const int64_t nq = std::min(ROW_STEP, base + per_head - r);
        pv_n(&w.acc[r * d], nq, &w.scores[r * CHUNK], vrows, n, hl * d, d);
      }
    }
  }
  for (int64_t hl = 0; hl < task.nh; ++hl)
    for (int64_t j = 0; j < nj; ++j) {
      T* dst = out + ((q_first + task.j0 + j) * s.heads() + (task.h0 + hl) * g) * d;
      for (int64_t x = 0; x < g; ++x) {
        const int64_t r = hl * per_head + j * g + x;
        const float inv = 1.0f / w.l[r];
        for (int64_t i = 0; i < d; ++i) store(&dst[x * d + i], w.acc[r * d + i] * inv);
      }
    }
}

// Checks that keep every read inside the cache and every write inside ``out``; 0 when they pass.
int check(const int32_t* tables, const int32_t* t_start, const int32_t* ctx,
          const int32_t* q_start, int64_t batch, int64_t block_size, int64_t num_blocks) {
  if (q_start[0] != 0 || t_start[0] != 0) return 3;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t qlen = int64_t{q_start[b + 1]} - q_start[b];
    if (qlen < 0 || qlen > ctx[b] || (qlen > 0 && ctx[b] < 1)) return 3;
    const int64_t needed = (int64_t{ctx[b]} + block_size - 1) / block_size;
    if (t_start[b + 1] < t_start[b] || needed > t_start[b + 1] - t_start[b]) return 2;
    for (int64_t i = 0; i < needed; ++i)
      if (tables[t_start[b] + i] < 0 || tables[t_start[b] + i] >= num_blocks) return 1;
  }
  return 0;
}

template <typename T>
int attend(const T* q, const T* kc, const T* vc, T* out, const int32_t* tables,
           const int32_t* t_start, const int32_t* ctx, const int32_t* q_start, int64_t batch,
           int64_t num_blocks, const Shape& s, float scale, int64_t window, int64_t decode_heads,
           int nthreads) {
  if (window < 1) return 3;
  if (int err = check(tables, t_start, ctx, q_start, batch, s.block_size, num_blocks))
    return err;
  // a prefill tile: up to TILE_ROWS rows, whole GQA groups; as many kv heads as fit
  const int64_t tile_tokens = std::max<int64_t>(1, std::min<int64_t>(CHUNK, TILE_ROWS / s.group));
  const int64_t tile_heads = std::max<int64_t>(1, TILE_ROWS / (tile_tokens * s.group));
  std::vector<Task> tasks;
  int64_t max_rows = 1;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t qlen = q_start[b + 1] - q_start[b];
    const int64_t nh = qlen == 1 ? decode_heads : std::min(tile_heads, s.kv_heads);
    const int64_t nj = qlen == 1 ? 1 : tile_tokens;
    for (int64_t j0 = 0; j0 < qlen; j0 += nj)
      for (int64_t h0 = 0; h0 < s.kv_heads; h0 += nh) {
        tasks.push_back({b, h0, std::min(nh, s.kv_heads - h0), j0, std::min(nj, qlen - j0)});
        max_rows = std::max(max_rows, tasks.back().nh * tasks.back().nj * s.group);
      }
  }
  // the longest contexts first, so the dynamic schedule ends with short tasks
  std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& a, const Task& b) {
    return ctx[a.seq] - q_start[a.seq + 1] + q_start[a.seq] + a.j0 >
           ctx[b.seq] - q_start[b.seq + 1] + q_start[b.seq] + b.j0;
  });
  const int64_t ntasks = static_cast<int64_t>(tasks.size());
#pragma omp parallel num_threads(nthreads)
  {
    Scratch w(max_rows, s.d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < ntasks; ++i) {
      const Task& t = tasks[i];
      run_task(t, q, kc, vc, out, tables + t_start[t.seq], ctx[t.seq], q_start[t.seq],
               q_start[t.seq + 1] - q_start[t.seq], s, scale, window, w);
    }
  }
  return 0;
}

}  // namespace

extern "C" {

int pagedkv_abi_version() { return 4; }

int pagedkv_vector_lanes() { return static_cast<int>(W); }

// q and out [T, heads, d] (the sequences' query tokens concatenated, sequence b's at rows
// q_start[b] .. q_start[b + 1]); the block tables concatenated likewise (sequence b's at
// tables[t_start[b]] .. tables[t_start[b + 1]]); window >= 1 the sliding window (a value no
// shorter than every context for none); returns 0, or 1 (a block id out of range), 2 (a table shorter
// than its context), 3 (inconsistent query offsets or lengths, or a window < 1), with nothing written.
#define PAGEDKV_ENTRY(NAME, T)                                                                  \
  int NAME(const T* q, const T* kc, const T* vc, T* out, const int32_t* tables,               \
           const int32_t* t_start, const int32_t* ctx, const int32_t* q_start, int64_t batch, \
           int64_t num_blocks, int64_t kv_heads, int64_t group, int64_t d, int64_t block_size, \
           float scale, int64_t window, int64_t decode_heads, int nthreads) {                 \
    const Shape s{kv_heads, group, d, block_size};                                            \
    return attend(q, kc, vc, out, tables, t_start, ctx, q_start, batch, num_blocks, s,        \
                  scale, window, decode_heads, nthreads);                                     \
  }

PAGEDKV_ENTRY(pagedkv_attention_f32, float)
PAGEDKV_ENTRY(pagedkv_attention_bf16, uint16_t)

}  // extern "C"
