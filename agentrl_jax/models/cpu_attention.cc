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
// the call finishes even when no scheduled task ever starts, and state outlives late tasks (shared_ptr).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

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

// `scores`, `denom` and `acc` are the participant's scratch, reused across its pairs (no allocation per pair once
// they have grown).
void RunPair(const Job& j, int64_t pair, std::vector<float>& scores, std::vector<float>& denom,
             std::vector<float>& acc) {
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

void Work(const std::shared_ptr<Job>& job) {
  std::vector<float> scores, denom, acc;
  const int64_t pairs = job->B * job->K;
  int64_t did = 0;
  for (int64_t p; (p = job->next.fetch_add(1, std::memory_order_relaxed)) < pairs; ++did)
    RunPair(*job, p, scores, denom, acc);
  if (did) job->done.fetch_add(did, std::memory_order_release);
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
  const int64_t pairs = B * K;
  const int64_t helpers = std::min<int64_t>(std::max<int64_t>(pool.num_threads(), 1), pairs) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([job] { Work(job); });
  Work(job);
  while (job->done.load(std::memory_order_acquire) < pairs) std::this_thread::yield();
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
