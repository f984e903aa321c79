// One-query-per-row attention over a KV cache that reads each row's own length (XLA:CPU FFI custom call).
//
// The decode step's attention (`attention_kernels.single_query_attention`) written as XLA reductions reads every
// slot of the cache's capacity for every row, masked; this kernel reads only the first `valid[b]` slots of row b,
// so a short row does not pay for the batch's longest. Built and registered by `models/cpu_kernels.py`.
//
// Operands (float32, row-major, as the sampler's per-layer cache lies on XLA:CPU):
//   q      [B, K, G, H]   the step's queries, grouped by kv head
//   k_t    [B, K, H, S]   keys, transposed (slot minor)
//   v      [B, K, S, H]   values
//   valid  [B] int32      slots [0, valid[b]) of row b are attended (at most S); valid[b] <= 0: row b takes no
//                         part in this step (its output is zeros and nothing of its cache is read)
// Attribute: scale (float). Result: out [B, K, G, H].
//
// Per (row, kv head): scores[g, s] = scale * sum_h q[g, h] k_t[h, s] for s < n, a softmax in float32 over those n
// slots, out[g, :] = sum_s p[g, s] v[s, :]. The (row, kv head) pairs are shared out over XLA's intra-op thread
// pool: every participant (the calling thread and the tasks it schedules) takes pairs from one atomic counter, so
// the call finishes even when no scheduled task ever starts, and state outlives late tasks (shared_ptr). Denormals
// flush to zero while a participant works (`PairWork`, shared with the training kernels below).
//
// Causal self-attention of whole rows for training and scoring (`AgentrlCausalAttentionFwd` / `...Bwd`, the
// gradient of `cpu_kernels.causal_attention`), with packed segments:
//   q [B, T, K, G, H], k and v [B, T, K, H], seg [B, T] int32; attributes scale (float), pad_zero (int32).
//   Query i attends keys j <= i with seg[j] == seg[i] (the model's causal + segment mask). The keys of a query are
//   the runs of its id up to i, found from the row's runs (one run per packed episode), so a packed row costs what
//   its episodes do, not T x T. pad_zero: segment id 0 is padding (`rl.batch.pack_minibatch`): its queries attend
//   nothing (output zeros) and are skipped by the gradient; the tokens of any other id see the same keys as under
//   the dense mask.
//   Forward results: out [B, T, K, G, H] and lse [B, K, G, T] (the log-sum-exp of each query's scaled scores).
//   Backward: from q, k, v, seg, out, lse and the output's cotangent dout, dq, dk and dv (FlashAttention-2's
//   recomputation: p = exp(scale q.k - lse), dv += p dout, ds = p (dout.v - dout.out), dq += scale ds k,
//   dk += scale ds q). Both passes go over micro-tiles of up to four consecutive queries of one run x their heads,
//   whose keys are loaded once for the tile. Each (row, kv head) pair owns its slices of every result, so pairs
//   share no writes; the pairs go to XLA's intra-op thread pool as in the decode kernel, and the sums run in a
//   fixed order (the results do not depend on the threads). Denormals flush to zero while a pass runs.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <xmmintrin.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Job {
  const float* q;
  const float* k_t;
  const float* v;
  const int32_t* valid;
  float* out;
  int64_t B, K, G, H, S;
  float scale;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

// A participant's scratch, reused across its pairs (no allocation per pair once it has grown).
struct DecodeScratch {
  std::vector<float> scores, denom, acc;
};

void DecodePair(const Job& j, int64_t pair, DecodeScratch& w) {
  std::vector<float>& scores = w.scores;
  std::vector<float>& denom = w.denom;
  std::vector<float>& acc = w.acc;
  const int64_t b = pair / j.K, G = j.G, H = j.H, S = j.S;
  float* out = j.out + pair * G * H;
  if (j.valid[b] <= 0) {  // a row outside this step (stopped, or waiting on a tool): no reads, zeros out
    std::fill(out, out + G * H, 0.0f);
    return;
  }
  const int64_t n = std::min<int64_t>(j.valid[b], S);
  const float* q = j.q + pair * G * H;
  const float* k_t = j.k_t + pair * H * S;
  const float* v = j.v + pair * S * H;
  scores.assign(G * n, 0.0f);
  // Scores: eight key rows (head dimensions, each over the slots) at a time, each read once for all G queries:
  // eight streams from memory at once, and an eighth of the passes over the scores (a row's keys lie in H rows
  // S apart, so one at a time the prefetcher restarts every row). The rest of H one row at a time.
  int64_t h = 0;
  for (; h + 8 <= H; h += 8) {
    const float* r0 = k_t + h * S;
    const float *r1 = r0 + S, *r2 = r1 + S, *r3 = r2 + S, *r4 = r3 + S, *r5 = r4 + S, *r6 = r5 + S, *r7 = r6 + S;
    for (int64_t g = 0; g < G; ++g) {
      const float* qg = q + g * H + h;
      const float q0 = qg[0], q1 = qg[1], q2 = qg[2], q3 = qg[3], q4 = qg[4], q5 = qg[5], q6 = qg[6], q7 = qg[7];
      float* sg = scores.data() + g * n;
      for (int64_t s = 0; s < n; ++s)
        sg[s] += ((q0 * r0[s] + q1 * r1[s]) + (q2 * r2[s] + q3 * r3[s])) +
                 ((q4 * r4[s] + q5 * r5[s]) + (q6 * r6[s] + q7 * r7[s]));
    }
  }
  for (; h < H; ++h) {
    const float* row = k_t + h * S;
    for (int64_t g = 0; g < G; ++g) {
      const float qh = q[g * H + h];
      float* sg = scores.data() + g * n;
      for (int64_t s = 0; s < n; ++s) sg[s] += qh * row[s];
    }
  }
  denom.resize(G);
  for (int64_t g = 0; g < G; ++g) {
    float* sg = scores.data() + g * n;
    float m = -INFINITY;
    for (int64_t s = 0; s < n; ++s) {
      sg[s] *= j.scale;
      m = std::max(m, sg[s]);
    }
    float sum = 0.0f;
    for (int64_t s = 0; s < n; ++s) {
      sg[s] = std::exp(sg[s] - m);
      sum += sg[s];
    }
    denom[g] = sum;
  }
  // Values: each value row is read once for all G queries, four rows (slots) at a time.
  acc.assign(G * H, 0.0f);
  int64_t s0 = 0;
  for (; s0 + 4 <= n; s0 += 4) {  // a quarter of the passes over the sums
    const float* r0 = v + s0 * H;
    const float *r1 = r0 + H, *r2 = r1 + H, *r3 = r2 + H;
    for (int64_t g = 0; g < G; ++g) {
      const float* pg = scores.data() + g * n + s0;
      const float p0 = pg[0], p1 = pg[1], p2 = pg[2], p3 = pg[3];
      float* ag = acc.data() + g * H;
      for (int64_t h = 0; h < H; ++h) ag[h] += (p0 * r0[h] + p1 * r1[h]) + (p2 * r2[h] + p3 * r3[h]);
    }
  }
  for (int64_t s = s0; s < n; ++s) {
    const float* row = v + s * H;
    for (int64_t g = 0; g < G; ++g) {
      const float p = scores[g * n + s];
      float* ag = acc.data() + g * H;
      for (int64_t h = 0; h < H; ++h) ag[h] += p * row[h];
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    const float inv = 1.0f / denom[g];
    for (int64_t h = 0; h < H; ++h) out[g * H + h] = acc[g * H + h] * inv;
  }
}

// One participant of a job over its (row, kv head) pairs: takes pairs from the job's shared counter until none is
// left. Denormal results flush to zero (and denormal inputs read as zero) on this thread while it works, as in
// XLA's own CPU kernels: the softmax's smallest weights and their gradients are denormal, and arithmetic on them
// is tens of times slower.
template <typename J, typename W, void (*Fn)(const J&, int64_t, W&)>
void PairWork(const std::shared_ptr<J>& job) {
  const unsigned int csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040);
  W w;
  const int64_t pairs = job->B * job->K;
  int64_t did = 0;
  for (int64_t p; (p = job->next.fetch_add(1, std::memory_order_relaxed)) < pairs; ++did) Fn(*job, p, w);
  _mm_setcsr(csr);
  if (did) job->done.fetch_add(did, std::memory_order_release);
}

// Runs the job's pairs on the calling thread and up to num_threads - 1 of XLA's pool, and returns when every pair
// is done. Each pair writes only its own outputs, so results do not depend on which thread took it.
template <typename J, typename W, void (*Fn)(const J&, int64_t, W&)>
void RunPairs(ffi::ThreadPool& pool, const std::shared_ptr<J>& job) {
  const int64_t pairs = job->B * job->K;
  const int64_t helpers = std::min<int64_t>(std::max<int64_t>(pool.num_threads(), 1), pairs) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([job] { PairWork<J, W, Fn>(job); });
  PairWork<J, W, Fn>(job);
  while (job->done.load(std::memory_order_acquire) < pairs) std::this_thread::yield();
}

ffi::Error SingleQueryAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k_t,
                                ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> valid, float scale,
                                ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), kd = k_t.dimensions(), vd = v.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || valid.dimensions().size() != 1)
    return ffi::Error::InvalidArgument("single_query_attention: q, k_t, v must be rank 4 and valid rank 1");
  const int64_t B = qd[0], K = qd[1], G = qd[2], H = qd[3], S = kd[3];
  if (kd[0] != B || kd[1] != K || kd[2] != H || vd[0] != B || vd[1] != K || vd[2] != S || vd[3] != H ||
      valid.dimensions()[0] != B)
    return ffi::Error::InvalidArgument("single_query_attention: shapes q [B,K,G,H], k_t [B,K,H,S], v [B,K,S,H], "
                                       "valid [B] do not agree");
  if (B * K == 0 || G * H == 0) return ffi::Error::Success();
  if (S == 0) return ffi::Error::InvalidArgument("single_query_attention: empty cache (S = 0)");
  auto job = std::make_shared<Job>();
  job->q = q.typed_data();
  job->k_t = k_t.typed_data();
  job->v = v.typed_data();
  job->valid = valid.typed_data();
  job->out = out->typed_data();
  job->B = B, job->K = K, job->G = G, job->H = H, job->S = S;
  job->scale = scale;
  RunPairs<Job, DecodeScratch, DecodePair>(pool, job);
  return ffi::Error::Success();
}


// ------------------------------------------------------------------------------------------------ training
struct Run {
  int64_t start, end;  // [start, end)
  int32_t id;
  int64_t prev;  // index of the previous run with the same id, or -1
};

struct RowAttn {
  const float* q;
  const float* k;
  const float* v;
  const int32_t* seg;
  const float* out;   // backward only
  const float* lse;   // backward only (forward: written)
  const float* dout;  // backward only
  float* o_out;       // forward
  float* lse_out;     // forward
  float* dq;
  float* dk;
  float* dv;
  int64_t B, T, K, G, H;
  float scale;
  bool pad_zero;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

// The row's runs of equal ids, each linked to the previous run of its id (runs are few: one per episode).
void RowRuns(const int32_t* seg, int64_t T, std::vector<Run>& runs, std::vector<int64_t>& run_of) {
  runs.clear();
  run_of.resize(T);
  for (int64_t t = 0; t < T; ++t) {
    if (t == 0 || seg[t] != seg[t - 1]) {
      int64_t prev = -1;
      for (int64_t r = static_cast<int64_t>(runs.size()) - 1; r >= 0; --r)
        if (runs[r].id == seg[t]) {
          prev = r;
          break;
        }
      runs.push_back({t, t, seg[t], prev});
    }
    runs.back().end = t + 1;
    run_of[t] = static_cast<int64_t>(runs.size()) - 1;
  }
}

// Keys [H, T] and values [H, T] of one (row, kv head), transposed so that a query's scores are sums over
// contiguous key positions (vectorised over the keys).
void Transpose(const float* x, int64_t T, int64_t stride, int64_t H, float* xt) {
  for (int64_t t = 0; t < T; ++t) {
    const float* r = x + t * stride;
    for (int64_t h = 0; h < H; ++h) xt[h * T + t] = r[h];
  }
}

// One key's terms of the gradients: dq += c k, dk += c q, dv += p dout (c = scale * ds), over the H dimensions.
void Accumulate(float c, float p, const float* __restrict__ k, const float* __restrict__ q,
                const float* __restrict__ dout, float* __restrict__ dq, float* __restrict__ dk,
                float* __restrict__ dv, int64_t H) {
  for (int64_t h = 0; h < H; ++h) {
    dq[h] += c * k[h];
    dk[h] += c * q[h];
    dv[h] += p * dout[h];
  }
}

struct Scratch {
  std::vector<Run> runs;
  std::vector<int64_t> run_of;
  std::vector<float> kt, vt;
  std::vector<std::pair<int64_t, int64_t>> ranges;
};

// The key ranges of query t: its own run up to t, then the earlier runs of its id (latest first).
void Ranges(const Scratch& w, int64_t t, std::vector<std::pair<int64_t, int64_t>>& ranges) {
  ranges.clear();
  const Run& own = w.runs[w.run_of[t]];
  ranges.emplace_back(own.start, t + 1);
  for (int64_t r = own.prev; r >= 0; r = w.runs[r].prev) ranges.emplace_back(w.runs[r].start, w.runs[r].end);
}

// Micro-tiles: up to kRows rows (a query and one of its heads) against the same keys, each key loaded once for all
// of them, eight keys (or head dimensions) per vector. GCC's vector extension: SSE, AVX or AVX-512 as -march allows.
typedef float V8 __attribute__((vector_size(32)));
inline V8 Load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void Store8(float* p, V8 v) { std::memcpy(p, &v, sizeof v); }
constexpr int kRows = 4;
constexpr int64_t kTileQueries = 4;  // consecutive queries of one run share their keys up to the first of them

// s[r][i] = sum_h w[r][h] xt[h, a + i] for i < n (xt: [H, T], the keys or values transposed).
template <int NR>
void TileDots(const float* const* w, const float* xt, int64_t T, int64_t H, int64_t a, int64_t n, float* const* s) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {  // sixteen keys: each row's weight loaded once for two vectors
    V8 acc0[NR] = {}, acc1[NR] = {};
    for (int64_t h = 0; h < H; ++h) {
      const V8 x0 = Load8(xt + h * T + a + i), x1 = Load8(xt + h * T + a + i + 8);
      for (int r = 0; r < NR; ++r) {
        const float wr = w[r][h];
        acc0[r] += wr * x0;
        acc1[r] += wr * x1;
      }
    }
    for (int r = 0; r < NR; ++r) Store8(s[r] + i, acc0[r]), Store8(s[r] + i + 8, acc1[r]);
  }
  for (; i + 8 <= n; i += 8) {
    V8 acc[NR] = {};
    for (int64_t h = 0; h < H; ++h) {
      const V8 x = Load8(xt + h * T + a + i);
      for (int r = 0; r < NR; ++r) acc[r] += w[r][h] * x;
    }
    for (int r = 0; r < NR; ++r) Store8(s[r] + i, acc[r]);
  }
  for (; i < n; ++i)
    for (int r = 0; r < NR; ++r) {
      float acc = 0.0f;
      for (int64_t h = 0; h < H; ++h) acc += w[r][h] * xt[h * T + a + i];
      s[r][i] = acc;
    }
}

// out[r][h] += sum_i p[r][i] x[(a + i) * stride + h] (x: keys or values in the operands' layout).
template <int NR>
void TileAxpy(const float* const* p, const float* x, int64_t stride, int64_t H, int64_t a, int64_t n,
              float* const* out) {
  int64_t h = 0;
  for (; h + 16 <= H; h += 16) {  // sixteen dimensions: each row's weight loaded once for two vectors
    V8 acc0[NR], acc1[NR];
    for (int r = 0; r < NR; ++r) acc0[r] = Load8(out[r] + h), acc1[r] = Load8(out[r] + h + 8);
    for (int64_t i = 0; i < n; ++i) {
      const V8 x0 = Load8(x + (a + i) * stride + h), x1 = Load8(x + (a + i) * stride + h + 8);
      for (int r = 0; r < NR; ++r) {
        const float pr = p[r][i];
        acc0[r] += pr * x0;
        acc1[r] += pr * x1;
      }
    }
    for (int r = 0; r < NR; ++r) Store8(out[r] + h, acc0[r]), Store8(out[r] + h + 8, acc1[r]);
  }
  for (; h + 8 <= H; h += 8) {
    V8 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = Load8(out[r] + h);
    for (int64_t i = 0; i < n; ++i) {
      const V8 xv = Load8(x + (a + i) * stride + h);
      for (int r = 0; r < NR; ++r) acc[r] += p[r][i] * xv;
    }
    for (int r = 0; r < NR; ++r) Store8(out[r] + h, acc[r]);
  }
  for (; h < H; ++h)
    for (int r = 0; r < NR; ++r) {
      float acc = out[r][h];
      for (int64_t i = 0; i < n; ++i) acc += p[r][i] * x[(a + i) * stride + h];
      out[r][h] = acc;
    }
}

// dk[a + i] += sum_r c[r][i] q[r], dv[a + i] += sum_r p[r][i] dout[r] (rows of the operands' layout): eight head
// dimensions at a time, the rows' q and dout of those dimensions held in registers over the keys.
template <int NR>
void TileKeyGrads(const float* const* c, const float* const* q, const float* const* p, const float* const* dout,
                  float* dk, float* dv, int64_t stride, int64_t H, int64_t a, int64_t n) {
  int64_t h = 0;
  for (; h + 8 <= H; h += 8) {
    V8 qv[NR], ov[NR];
    const float* cr[NR];
    const float* pr[NR];
    for (int r = 0; r < NR; ++r) qv[r] = Load8(q[r] + h), ov[r] = Load8(dout[r] + h), cr[r] = c[r], pr[r] = p[r];
    float* dkr = dk + a * stride + h;
    float* dvr = dv + a * stride + h;
    for (int64_t i = 0; i < n; ++i, dkr += stride, dvr += stride) {
      V8 k = Load8(dkr), v = Load8(dvr);
      for (int r = 0; r < NR; ++r) {
        k += cr[r][i] * qv[r];
        v += pr[r][i] * ov[r];
      }
      Store8(dkr, k);
      Store8(dvr, v);
    }
  }
  for (; h < H; ++h)
    for (int64_t i = 0; i < n; ++i)
      for (int r = 0; r < NR; ++r) {
        dk[(a + i) * stride + h] += c[r][i] * q[r][h];
        dv[(a + i) * stride + h] += p[r][i] * dout[r][h];
      }
}

// Calls f(nr, r) over the rows [0, R) in blocks of kRows (nr: std::integral_constant<int, rows in the block>, a
// compile-time count for the tile functions' register arrays), the last block with the 1-3 rows left.
template <typename F>
void ForRowBlocks(int64_t R, F&& f) {
  int64_t r = 0;
  for (; r + kRows <= R; r += kRows) f(std::integral_constant<int, kRows>{}, r);
  switch (R - r) {
    case 3: f(std::integral_constant<int, 3>{}, r); break;
    case 2: f(std::integral_constant<int, 2>{}, r); break;
    case 1: f(std::integral_constant<int, 1>{}, r); break;
    default: break;
  }
}

// The tile's rows: query t0 + r / G, head r % G; every row reads the common key ranges (those of query t0), and
// row r's query also the tail keys (t0, t0 + r / G].
struct Tile {
  int64_t t0, nq, R;
  std::vector<const float*> q, dout, out_in;
  std::vector<float*> s, dp, o, dq;  // dp, dq: backward; o: forward
  std::vector<float> sum;            // forward: each row's softmax denominator
};

// The tile rows' p . x over keys [a, a + n) summed into out (one row vector each): p[r] + off holds row r's
// weights of those keys (TileAxpy).
void RowsAxpy(const std::vector<float*>& p, const float* x, int64_t stride, int64_t H, int64_t a, int64_t n,
              std::vector<float*>& out, int64_t off) {
  ForRowBlocks(static_cast<int64_t>(p.size()), [&](auto nr, int64_t r) {
    constexpr int NR = decltype(nr)::value;
    const float* pp[NR];
    for (int i = 0; i < NR; ++i) pp[i] = p[r + i] + off;
    TileAxpy<NR>(pp, x, stride, H, a, n, out.data() + r);
  });
}

// The scores of the tile's rows against their keys, unscaled: the common ranges at [0, ncommon), then row r's
// tail keys after them. xt: the keys (or values) transposed; w: the rows' vectors.
int64_t TileScores(const Scratch& w, const Tile& tl, const std::vector<const float*>& vecs, const float* xt,
                   int64_t T, int64_t H, int64_t G, std::vector<float*>& s) {
  int64_t off = 0;
  for (auto [a, e] : w.ranges) {
    ForRowBlocks(tl.R, [&](auto nr, int64_t r) {
      constexpr int NR = decltype(nr)::value;
      float* sp[NR];
      for (int i = 0; i < NR; ++i) sp[i] = s[r + i] + off;
      TileDots<NR>(vecs.data() + r, xt, T, H, a, e - a, sp);
    });
    off += e - a;
  }
  for (int64_t r = 0; r < tl.R; ++r)
    for (int64_t key = tl.t0 + 1; key <= tl.t0 + r / G; ++key) {
      float acc = 0.0f;
      for (int64_t h = 0; h < H; ++h) acc += vecs[r][h] * xt[h * T + key];
      s[r][off + key - tl.t0 - 1] = acc;
    }
  return off;
}

// The tile starting at query t0 of the pair: up to kTileQueries consecutive queries of t0's run (one id).
int64_t TileQueries(const Scratch& w, int64_t t0) {
  const int64_t end = w.runs[w.run_of[t0]].end;
  return std::min<int64_t>(kTileQueries, end - t0);
}

void SetupTile(const RowAttn& j, int64_t b, int64_t kh, int64_t t0, int64_t nq, Tile& tl, int64_t width,
               std::vector<float>& sbuf, std::vector<float>& dpbuf, bool backward) {
  const int64_t T = j.T, K = j.K, G = j.G, H = j.H;
  tl.t0 = t0, tl.nq = nq, tl.R = nq * G;
  tl.q.resize(tl.R), tl.s.resize(tl.R);
  if (backward)
    tl.dout.resize(tl.R), tl.out_in.resize(tl.R), tl.dp.resize(tl.R), tl.dq.resize(tl.R);
  else
    tl.o.resize(tl.R);
  if (sbuf.size() < static_cast<size_t>(tl.R * width)) sbuf.resize(tl.R * width);
  if (backward && dpbuf.size() < static_cast<size_t>(tl.R * width)) dpbuf.resize(tl.R * width);
  for (int64_t r = 0; r < tl.R; ++r) {
    const int64_t at = ((b * T + t0 + r / G) * K + kh) * G * H + (r % G) * H;
    tl.q[r] = j.q + at;
    tl.s[r] = sbuf.data() + r * width;
    if (backward) {
      tl.dout[r] = j.dout + at, tl.out_in[r] = j.out + at, tl.dq[r] = j.dq + at;
      tl.dp[r] = dpbuf.data() + r * width;
    } else {
      tl.o[r] = j.o_out + at;
    }
  }
}

void ForwardPair(const RowAttn& j, int64_t pair, Scratch& w) {
  const int64_t b = pair / j.K, kh = pair % j.K, T = j.T, K = j.K, G = j.G, H = j.H;
  const int32_t* seg = j.seg + b * T;
  RowRuns(seg, T, w.runs, w.run_of);
  w.kt.resize(H * T);
  Transpose(j.k + (b * T * K + kh) * H, T, K * H, H, w.kt.data());
  const float* vrow = j.v + (b * T * K + kh) * H;  // value of key t at vrow + t * K * H
  Tile tl;
  std::vector<float> sbuf, unused;
  for (int64_t t0 = 0; t0 < T;) {
    if (j.pad_zero && seg[t0] == 0) {
      std::fill(j.o_out + ((b * T + t0) * K + kh) * G * H, j.o_out + ((b * T + t0) * K + kh + 1) * G * H, 0.0f);
      for (int64_t g = 0; g < G; ++g) j.lse_out[(b * K + kh) * G * T + g * T + t0] = 0.0f;
      ++t0;
      continue;
    }
    const int64_t nq = TileQueries(w, t0);
    Ranges(w, t0, w.ranges);
    int64_t ncommon = 0;
    for (auto [a, e] : w.ranges) ncommon += e - a;
    SetupTile(j, b, kh, t0, nq, tl, ncommon + nq, sbuf, unused, false);
    TileScores(w, tl, tl.q, w.kt.data(), T, H, G, tl.s);
    tl.sum.resize(tl.R);
    for (int64_t r = 0; r < tl.R; ++r) {
      const int64_t n = ncommon + r / G;
      float* s = tl.s[r];
      float m = -INFINITY;
      for (int64_t i = 0; i < n; ++i) {
        s[i] *= j.scale;
        m = std::max(m, s[i]);
      }
      float sum = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        s[i] = std::exp(s[i] - m);
        sum += s[i];
      }
      tl.sum[r] = sum;
      j.lse_out[(b * K + kh) * G * T + (r % G) * T + t0 + r / G] = m + std::log(sum);
      std::fill(tl.o[r], tl.o[r] + H, 0.0f);
    }
    int64_t off = 0;
    for (auto [a, e] : w.ranges) {
      RowsAxpy(tl.s, vrow, K * H, H, a, e - a, tl.o, off);
      off += e - a;
    }
    for (int64_t r = 0; r < tl.R; ++r) {
      float* o = tl.o[r];
      for (int64_t key = t0 + 1; key <= t0 + r / G; ++key) {
        const float p = tl.s[r][ncommon + key - t0 - 1];
        const float* vr = vrow + key * K * H;
        for (int64_t h = 0; h < H; ++h) o[h] += p * vr[h];
      }
      const float inv = 1.0f / tl.sum[r];
      for (int64_t h = 0; h < H; ++h) o[h] *= inv;
    }
    t0 += nq;
  }
}

void BackwardPair(const RowAttn& j, int64_t pair, Scratch& w) {
  const int64_t b = pair / j.K, kh = pair % j.K, T = j.T, K = j.K, G = j.G, H = j.H;
  const int32_t* seg = j.seg + b * T;
  RowRuns(seg, T, w.runs, w.run_of);
  const int64_t kv0 = (b * T * K + kh) * H;  // key / value t of this pair at kv0 + t * K * H
  w.kt.resize(H * T);
  w.vt.resize(H * T);
  Transpose(j.k + kv0, T, K * H, H, w.kt.data());
  Transpose(j.v + kv0, T, K * H, H, w.vt.data());
  for (int64_t t = 0; t < T; ++t) {  // this pair's dq, dk and dv rows, accumulated below
    std::fill(j.dk + kv0 + t * K * H, j.dk + kv0 + t * K * H + H, 0.0f);
    std::fill(j.dv + kv0 + t * K * H, j.dv + kv0 + t * K * H + H, 0.0f);
    const int64_t qo = ((b * T + t) * K + kh) * G * H;
    std::fill(j.dq + qo, j.dq + qo + G * H, 0.0f);
  }
  Tile tl;
  std::vector<float> sbuf, dpbuf;
  for (int64_t t0 = 0; t0 < T;) {
    if (j.pad_zero && seg[t0] == 0) {
      ++t0;
      continue;
    }
    const int64_t nq = TileQueries(w, t0);
    Ranges(w, t0, w.ranges);
    int64_t ncommon = 0;
    for (auto [a, e] : w.ranges) ncommon += e - a;
    SetupTile(j, b, kh, t0, nq, tl, ncommon + nq, sbuf, dpbuf, true);
    TileScores(w, tl, tl.q, w.kt.data(), T, H, G, tl.s);
    TileScores(w, tl, tl.dout, w.vt.data(), T, H, G, tl.dp);
    for (int64_t r = 0; r < tl.R; ++r) {
      const int64_t n = ncommon + r / G;
      const float lse = j.lse[(b * K + kh) * G * T + (r % G) * T + t0 + r / G];
      float d = 0.0f;
      for (int64_t h = 0; h < H; ++h) d += tl.dout[r][h] * tl.out_in[r][h];
      float* s = tl.s[r];
      float* dp = tl.dp[r];
      for (int64_t i = 0; i < n; ++i) {
        const float p = std::exp(s[i] * j.scale - lse);
        s[i] = p;
        dp[i] = p * (dp[i] - d) * j.scale;  // scale * ds
      }
    }
    int64_t off = 0;
    for (auto [a, e] : w.ranges) {
      RowsAxpy(tl.dp, j.k + kv0, K * H, H, a, e - a, tl.dq, off);
      ForRowBlocks(tl.R, [&](auto nr, int64_t r) {
        constexpr int NR = decltype(nr)::value;
        const float *c[NR], *p[NR];
        for (int i = 0; i < NR; ++i) c[i] = tl.dp[r + i] + off, p[i] = tl.s[r + i] + off;
        TileKeyGrads<NR>(c, tl.q.data() + r, p, tl.dout.data() + r, j.dk + kv0, j.dv + kv0, K * H, H, a, e - a);
      });
      off += e - a;
    }
    for (int64_t r = 0; r < tl.R; ++r)
      for (int64_t key = t0 + 1; key <= t0 + r / G; ++key) {
        const int64_t i = ncommon + key - t0 - 1;
        Accumulate(tl.dp[r][i], tl.s[r][i], j.k + kv0 + key * K * H, tl.q[r], tl.dout[r], tl.dq[r],
                   j.dk + kv0 + key * K * H, j.dv + kv0 + key * K * H, H);
      }
    t0 += nq;
  }
}

// Checks q [B,T,K,G,H], k and v [B,T,K,H], seg [B,T] and fills the job's sizes.
ffi::Error RowShapes(ffi::Buffer<ffi::F32>& q, ffi::Buffer<ffi::F32>& k, ffi::Buffer<ffi::F32>& v,
                     ffi::Buffer<ffi::S32>& seg, RowAttn& job) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), sd = seg.dimensions();
  if (qd.size() != 5 || kd.size() != 4 || vd.size() != 4 || sd.size() != 2)
    return ffi::Error::InvalidArgument("causal_attention: q must be rank 5, k and v rank 4, seg rank 2");
  job.B = qd[0], job.T = qd[1], job.K = qd[2], job.G = qd[3], job.H = qd[4];
  for (int i = 0; i < 4; ++i)
    if (kd[i] != (i < 3 ? qd[i] : job.H) || vd[i] != kd[i])
      return ffi::Error::InvalidArgument("causal_attention: shapes q [B,T,K,G,H], k and v [B,T,K,H] do not agree");
  if (sd[0] != job.B || sd[1] != job.T)
    return ffi::Error::InvalidArgument("causal_attention: seg must be [B, T]");
  job.q = q.typed_data(), job.k = k.typed_data(), job.v = v.typed_data(), job.seg = seg.typed_data();
  return ffi::Error::Success();
}

ffi::Error CausalAttentionFwd(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                              ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> seg, float scale, int32_t pad_zero,
                              ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> lse) {
  auto job = std::make_shared<RowAttn>();
  if (auto e = RowShapes(q, k, v, seg, *job); e.failure()) return e;
  job->o_out = out->typed_data(), job->lse_out = lse->typed_data();
  job->scale = scale, job->pad_zero = pad_zero != 0;
  if (job->B * job->K == 0 || job->T * job->G * job->H == 0) return ffi::Error::Success();
  RunPairs<RowAttn, Scratch, ForwardPair>(pool, job);
  return ffi::Error::Success();
}

ffi::Error CausalAttentionBwd(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                              ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> seg, ffi::Buffer<ffi::F32> out,
                              ffi::Buffer<ffi::F32> lse, ffi::Buffer<ffi::F32> dout, float scale, int32_t pad_zero,
                              ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                              ffi::ResultBuffer<ffi::F32> dv) {
  auto job = std::make_shared<RowAttn>();
  if (auto e = RowShapes(q, k, v, seg, *job); e.failure()) return e;
  job->out = out.typed_data(), job->lse = lse.typed_data(), job->dout = dout.typed_data();
  job->dq = dq->typed_data(), job->dk = dk->typed_data(), job->dv = dv->typed_data();
  job->scale = scale, job->pad_zero = pad_zero != 0;
  if (job->B * job->K == 0 || job->T * job->G * job->H == 0) return ffi::Error::Success();
  RunPairs<RowAttn, Scratch, BackwardPair>(pool, job);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AgentrlSingleQueryAttention, SingleQueryAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<float>("scale")
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AgentrlCausalAttentionFwd, CausalAttentionFwd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("pad_zero")
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AgentrlCausalAttentionBwd, CausalAttentionBwd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("pad_zero")
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
