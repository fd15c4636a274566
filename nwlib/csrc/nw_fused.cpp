// Fused Nadaraya-Watson (softmax attention) forward for small head dimensions, on ATen's
// vectorised types. out[b, h, i, :] = sum_j w_ij v[b, h, j, :] with w_ij ∝ exp(scale·(<q_i, k_j> +
// offset_j)), in one pass over the keys with a running maximum (online softmax), so that no (m, n)
// weight matrix is formed. Forward only: nwlib/_fused.py routes autograd to SDPA.
//
// The logits are formed in base 2: the queries and the offsets carry scale·log2(e), so that the
// weights are 2^(logit - shift) and the exponential costs no multiply. float32 uses nwlib's own
// exp2 (exp2_poly below: a degree-5 polynomial and an exponent scaling, within 2 ulp), float64
// Sleef's 1-ulp exp2; both set weights below 2^CUTOFF of the running maximum to 0, so that no
// arithmetic is done on subnormal numbers. The scale is one number, or one per (b, h) (a
// bandwidth per head), applied here rather than to copies of the inputs.
//
// Inputs (built by nwlib/_fused.py as views): q (B, H, m, d), k (B, H, n, d), v (B, H, n, p),
// offset (B, H, n) or an undefined tensor (or, for the Gaussian kernel, computed from the keys
// here: gaussian = true), of one dtype and any strides (the batch dimensions of
// broadcast inputs have stride 0). Each thread copies the keys, offsets and values of the (b, h)
// it works on into its own buffers, transposed to (d, N), (N,) and (p, N), N the key count
// padded to the vector width (offset -inf on the padding), once per distinct source: an input
// shared by many (b, h) is laid out once per thread. Returns (B, H, m, p), contiguous.
#include <torch/extension.h>
#include <c10/macros/Macros.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/cpu/vec/functional.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using at::vec::Vectorized;

#if defined(CPU_CAPABILITY_AVX512)
inline bool any_above(const Vectorized<float>& x, const Vectorized<float>& t) {
  return _mm512_cmp_ps_mask(x, t, _CMP_GT_OQ) != 0;
}
inline bool any_above(const Vectorized<double>& x, const Vectorized<double>& t) {
  return _mm512_cmp_pd_mask(x, t, _CMP_GT_OQ) != 0;
}
#elif defined(CPU_CAPABILITY_AVX2)
inline bool any_above(const Vectorized<float>& x, const Vectorized<float>& t) {
  return _mm256_movemask_ps(_mm256_cmp_ps(x, t, _CMP_GT_OQ)) != 0;
}
inline bool any_above(const Vectorized<double>& x, const Vectorized<double>& t) {
  return _mm256_movemask_pd(_mm256_cmp_pd(x, t, _CMP_GT_OQ)) != 0;
}
#else
#error "nw_fused.cpp is built for AVX2 or AVX-512 only (nwlib/_fused.py)"
#endif

// The horizontal maximum and sum of a vector (a copy: the vectors of the tile stay in registers).
template <typename T>
inline T hmax(Vectorized<T> x) {
  using Vec = Vectorized<T>;
  return at::vec::vec_reduce_all<T>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, x);
}
template <typename T>
inline T hsum(Vectorized<T> x) {
  using Vec = Vectorized<T>;
  return at::vec::vec_reduce_all<T>([](Vec& a, Vec& b) { return a + b; }, x);
}

// Weights below 2^CUTOFF<T> (relative to the running maximum, whose own weight, at least 1, is
// in the sum) are set to exactly 0. Without the cut, small bandwidths make many weights and their
// products with the values subnormal, and every arithmetic operation on a subnormal number takes
// a microcode assist: 3.4x slower at the Scott bandwidth of the engine benchmark, 27x at h = 0.2,
// on the Intel Xeon measured (one thread, flushing subnormals to zero removed the difference).
// What is cut is at most n·2^CUTOFF of the sum: 2^-40 relative for n = 2^24 keys in float32.
// The weights kept are at least 2^-64 in float32, so their products with values |v| >= 2^-62 are normal.
template <typename T>
constexpr T CUTOFF = std::is_same_v<T, float> ? T(-64) : T(-256);

// 2^t in float32 for t <= 128, exactly 0 for t < CUTOFF (-inf, the padding, included): t = n + f
// with n an integer and |f| <= 1/2, 2^f by a degree-5 polynomial (coefficients fitted to the
// relative error of 2^f on [-1/2, 1/2] by iteratively reweighted least squares; 1.9e-7 relative
// in float32 arithmetic, tests/test_kernels.py), 2^n put into the exponent (AVX-512's scalef,
// zero-masked below the cutoff; AVX2: the exponent field, and-ed with the cutoff's mask). Nine
// (AVX-512) or thirteen (AVX2) vector operations, against about nineteen for ATen's exp_u20.
inline Vectorized<float> exp2_poly(const Vectorized<float>& t) {
  using Vec = Vectorized<float>;
  const Vec n = t.round();  // -inf: n = -inf and f = NaN, a lane the mask sets to 0
  const Vec f = t - n;
  Vec p = Vec(0.001326472731307149f);
  p = at::vec::fmadd(p, f, Vec(0.009671512991189957f));
  p = at::vec::fmadd(p, f, Vec(0.05550733581185341f));
  p = at::vec::fmadd(p, f, Vec(0.24022242426872253f));
  p = at::vec::fmadd(p, f, Vec(0.6931470036506653f));
  p = at::vec::fmadd(p, f, Vec(1.0f));
#if defined(CPU_CAPABILITY_AVX512)
  const __mmask16 keep = _mm512_cmp_ps_mask(t, _mm512_set1_ps(CUTOFF<float>), _CMP_GE_OQ);
  return _mm512_maskz_scalef_ps(keep, p, n);
#else
  const __m256 keep = _mm256_cmp_ps(t, _mm256_set1_ps(CUTOFF<float>), _CMP_GE_OQ);
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(p * Vec(_mm256_castsi256_ps(e)), keep);
#endif
}

// float64: Sleef's 1-ulp exp2, 0 below the cutoff.
inline Vectorized<double> exp2_cut(const Vectorized<double>& t) {
  const Vectorized<double> e = t.exp2();
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(t, _mm512_set1_pd(CUTOFF<double>), _CMP_GE_OQ), e);
#else
  return _mm256_and_pd(e, _mm256_cmp_pd(t, _mm256_set1_pd(CUTOFF<double>), _CMP_GE_OQ));
#endif
}

template <typename T>
inline Vectorized<T> vexp2(const Vectorized<T>& x) {
  if constexpr (std::is_same_v<T, float>) {
    return exp2_poly(x);
  } else {
    return exp2_cut(x);
  }
}

// The accumulators are rescaled only when a logit exceeds the current shift by more than
// HEADROOM (base 2), so the weights are at most 2^HEADROOM (n of them are far from overflow in
// float32) and the rescale, a horizontal maximum and one scalar exp2, happens a few times per query.
template <typename T>
constexpr T HEADROOM = T(16);

// QT queries per tile: each key vector is loaded once for QT queries; two where each carries
// eight accumulators, so that they stay in registers. Measured side by side (float32, n = 2048,
// m = 256, 2 threads, Intel Xeon): four queries against two is 1.5x at d = 8, p = 1, and 1.2x at
// p = 2 and p = 4; two against one 1.2x at p = 8.
template <int P>
constexpr int64_t queries_per_tile() { return P > 0 && P <= 4 ? 4 : 2; }

// Key vectors per step: two, so that each broadcast query coordinate serves two multiply-adds
// (4-9 % faster than one at d = 8 in the same measurement); a last odd key vector takes a step of one.
constexpr int KEY_STEP = 2;

// Where the time goes, measured by taking parts out in experimental builds (float32, d = 8, p = 1,
// n = 2048, m = 256, 2 threads, Intel Xeon Sapphire Rapids; fraction of the measured limit, the
// mix loop of mix_rate): the kernel 58-62 %; without the headroom check 61 %; with one logit
// multiply-add instead of eight 97 %; without the exp2 87 %; with n = 512 (keys, offsets and values
// in L1) 59 %. Two or four independent multiply-adds more per key vector and query cost 40-60 % of
// their issue time at two per cycle. So no single part, and not the memory, accounts for the gap; this VM exposes no
// performance counters to say which resource stalls.
// On an AMD EPYC (family 25, model 17; benchmarks/results/machines/) the kernel reaches 65-67 % of the
// same limit with the AVX-512 build and 62-67 % with the AVX2 one (one run of 7 rounds and one of 21
// each). There, an exp2 by vreduceps (t - floor(t) in one instruction) and scalef of t itself, the
// polynomial refitted on [0, 1) (the same relative error), eight vector operations instead of nine,
// was no faster (61 % against 63 %, side by side).
template <typename T, int D, int P>
void tile(const T* q, int64_t d_rt, const T* kt, const T* bias, const T* vt, int64_t p_rt, int64_t N,
          int64_t nq, T* out, int64_t out_stride_row) {
  using Vec = Vectorized<T>;
  constexpr int64_t W = Vec::size();
  constexpr int64_t QT = queries_per_tile<P>();
  const int64_t d = D > 0 ? D : d_rt;
  const int64_t p = P > 0 ? P : p_rt;
  constexpr T NEG_INF = -std::numeric_limits<T>::infinity();
  // P > 0: the accumulators are a flat fixed-size array that the fully unrolled loops below keep
  // in registers (as a two-dimensional array GCC kept them on the stack); P = 0 (any width): on the heap.
  constexpr int64_t PS = P > 0 ? P : 1;
  Vec acc[QT * PS];
  std::vector<Vec> acc_heap(P > 0 ? 0 : QT * p, Vec(T(0)));
  T shift[QT];
  Vec sums[QT], shifts[QT];
  const Vec headroom(HEADROOM<T>);
#pragma GCC unroll 8
  for (int64_t r = 0; r < QT; ++r) {
    shift[r] = NEG_INF;
    shifts[r] = Vec(NEG_INF);
    sums[r] = Vec(T(0));
#pragma GCC unroll 8
    for (int64_t c = 0; c < PS; ++c) acc[r * PS + c] = Vec(T(0));
  }
  // U key vectors from j0 on: their logits for the QT queries, then each one's weights.
  auto step = [&](auto key_vectors, int64_t j0) {
    constexpr int U = decltype(key_vectors)::value;
    Vec l[U][QT];
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      const Vec b = Vec::loadu(bias + j0 + u * W);
#pragma GCC unroll 8
      for (int64_t r = 0; r < QT; ++r) l[u][r] = b;
    }
#pragma GCC unroll 8
    for (int64_t c = 0; c < d; ++c) {
      Vec kv[U];
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) kv[u] = Vec::loadu(kt + c * N + j0 + u * W);
#pragma GCC unroll 8
      for (int64_t r = 0; r < QT; ++r) {
        const Vec qb(q[r * d + c]);
#pragma GCC unroll 8
        for (int u = 0; u < U; ++u) l[u][r] = at::vec::fmadd(qb, kv[u], l[u][r]);
      }
    }
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      const int64_t j = j0 + u * W;
#pragma GCC unroll 8
      for (int64_t r = 0; r < QT; ++r) {
        Vec t = l[u][r] - shifts[r];
        if (C10_UNLIKELY(any_above(t, headroom))) {
          const T mx = hmax<T>(l[u][r]);
          if (shift[r] != NEG_INF) {
            const Vec alpha = Vec(std::exp2(shift[r] - mx));
            sums[r] = sums[r] * alpha;
            if constexpr (P > 0) {
#pragma GCC unroll 8
              for (int64_t c = 0; c < P; ++c) acc[r * PS + c] = acc[r * PS + c] * alpha;
            } else {
              for (int64_t c = 0; c < p; ++c) acc_heap[r * p + c] = acc_heap[r * p + c] * alpha;
            }
          }
          shift[r] = mx;
          shifts[r] = Vec(mx);
          t = l[u][r] - shifts[r];
        }
        const Vec e = vexp2<T>(t);
        sums[r] = sums[r] + e;
        if constexpr (P > 0) {
#pragma GCC unroll 8
          for (int64_t c = 0; c < P; ++c)
            acc[r * PS + c] = at::vec::fmadd(e, Vec::loadu(vt + c * N + j), acc[r * PS + c]);
        } else {
          for (int64_t c = 0; c < p; ++c)
            acc_heap[r * p + c] = at::vec::fmadd(e, Vec::loadu(vt + c * N + j), acc_heap[r * p + c]);
        }
      }
    }
  };
  int64_t j0 = 0;
  for (; j0 + KEY_STEP * W <= N; j0 += KEY_STEP * W) step(std::integral_constant<int, KEY_STEP>{}, j0);
  for (; j0 < N; j0 += W) step(std::integral_constant<int, 1>{}, j0);
#pragma GCC unroll 8
  for (int64_t r = 0; r < QT; ++r) {
    if (r >= nq) break;
    const T s = hsum<T>(sums[r]);
    if constexpr (P > 0) {
#pragma GCC unroll 8
      for (int64_t c = 0; c < P; ++c) out[r * out_stride_row + c] = hsum<T>(acc[r * PS + c]) / s;
    } else {
      for (int64_t c = 0; c < p; ++c) out[r * out_stride_row + c] = hsum<T>(acc_heap[r * p + c]) / s;
    }
  }
}

// One thread's transposed copy of the keys, offsets and values of one (b, h), kept while the
// thread's next (b, h) reads the same memory (a broadcast input).
template <typename T>
struct Layout {
  std::vector<T> kt, bias, vt, centre;
  const T *k = nullptr, *off = nullptr, *v = nullptr;
  T scale = T(0);  // the bias carries the scale: a (b, h) of another scale is laid out anew
  bool valid = false;
};

template <typename T, int D, int P>
void run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& offset, double scale,
         const at::Tensor& scales, bool gaussian, at::Tensor& out) {
  using Vec = Vectorized<T>;
  const int64_t B = q.size(0), H = q.size(1), m = q.size(2), d = q.size(3);
  const int64_t n = k.size(2), p = v.size(3);
  const int64_t N = (n + Vec::size() - 1) / Vec::size() * Vec::size();
  constexpr int64_t QT = queries_per_tile<P>();
  const int64_t tiles = (m + QT - 1) / QT;
  const bool has_offset = offset.defined();
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  const T* op = has_offset ? offset.data_ptr<T>() : nullptr;
  T* outp = out.data_ptr<T>();
  const bool per_bh = scales.defined();
  const T* sp = per_bh ? scales.data_ptr<T>() : nullptr;
  at::parallel_for(0, B * H * tiles, 1, [&](int64_t begin, int64_t end) {
    Layout<T> lay;
    lay.kt.resize(d * N);
    lay.bias.resize(N);
    lay.vt.resize(p * N);
    lay.centre.assign(d, T(0));
    alignas(64) T qbuf[QT * 64];  // d <= 64
    for (int64_t t = begin; t < end; ++t) {
      const int64_t bh = t / tiles, i0 = (t % tiles) * QT;
      const int64_t b = bh / H, h = bh % H;
      const int64_t nq = std::min(QT, m - i0);
      const T* ksrc = kp + b * k.stride(0) + h * k.stride(1);
      const T* vsrc = vp + b * v.stride(0) + h * v.stride(1);
      const T* osrc = has_offset ? op + b * offset.stride(0) + h * offset.stride(1) : nullptr;
      // scale·log2(e): the logits in base 2, from the one scale or this (b, h)'s
      const double bh_scale = per_bh ? double(sp[b * scales.stride(0) + h * scales.stride(1)]) : scale;
      const T log2_scale = T(bh_scale / std::log(2.0));
      if (!lay.valid || ksrc != lay.k || vsrc != lay.v || osrc != lay.off || log2_scale != lay.scale) {
        const int64_t ks0 = k.stride(2), ks1 = k.stride(3), vs0 = v.stride(2), vs1 = v.stride(3);
        for (int64_t c = 0; c < d; ++c) {
          T* row = lay.kt.data() + c * N;
          for (int64_t j = 0; j < n; ++j) row[j] = ksrc[j * ks0 + c * ks1];
          std::fill(row + n, row + N, T(0));
        }
        for (int64_t c = 0; c < p; ++c) {
          T* row = lay.vt.data() + c * N;
          for (int64_t j = 0; j < n; ++j) row[j] = vsrc[j * vs0 + c * vs1];
          std::fill(row + n, row + N, T(0));
        }
        if (gaussian) {
          // The Gaussian kernel: keys and queries centred on the keys' mean (translation
          // invariance; it keeps <q, k> and |k|^2 small, which float32 accuracy depends on), and
          // the offset -|k - c|^2 / 2, computed here rather than by tensor operations on the inputs.
          for (int64_t c = 0; c < d; ++c) {
            T* row = lay.kt.data() + c * N;
            double total = 0.0;
            for (int64_t j = 0; j < n; ++j) total += row[j];
            const T centre = T(total / double(n));
            lay.centre[c] = centre;
            for (int64_t j = 0; j < n; ++j) row[j] -= centre;
          }
          std::fill(lay.bias.begin(), lay.bias.begin() + n, T(0));
          for (int64_t c = 0; c < d; ++c) {
            const T* row = lay.kt.data() + c * N;
            for (int64_t j = 0; j < n; ++j) lay.bias[j] += row[j] * row[j];
          }
          for (int64_t j = 0; j < n; ++j) lay.bias[j] *= T(-0.5) * log2_scale;
        } else if (has_offset) {
          const int64_t os = offset.stride(2);
          for (int64_t j = 0; j < n; ++j) lay.bias[j] = osrc[j * os] * log2_scale;
        } else {
          std::fill(lay.bias.begin(), lay.bias.begin() + n, T(0));
        }
        std::fill(lay.bias.begin() + n, lay.bias.end(), -std::numeric_limits<T>::infinity());
        lay.k = ksrc, lay.v = vsrc, lay.off = osrc, lay.scale = log2_scale, lay.valid = true;
      }
      const T* qrow = qp + b * q.stride(0) + h * q.stride(1) + i0 * q.stride(2);
      std::fill(qbuf, qbuf + QT * d, T(0));
      for (int64_t r = 0; r < nq; ++r)
        for (int64_t c = 0; c < d; ++c)
          qbuf[r * d + c] = (qrow[r * q.stride(2) + c * q.stride(3)] - lay.centre[c]) * log2_scale;
      tile<T, D, P>(qbuf, d, lay.kt.data(), lay.bias.data(), lay.vt.data(), p, N, nq,
                    outp + ((b * H + h) * m + i0) * p, p);
    }
  });
}

template <typename T, int P>
void dispatch_d(int64_t d, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& offset,
                double scale, const at::Tensor& scales, bool gaussian, at::Tensor& out) {
  switch (d) {
    case 1: return run<T, 1, P>(q, k, v, offset, scale, scales, gaussian, out);
    case 2: return run<T, 2, P>(q, k, v, offset, scale, scales, gaussian, out);
    case 4: return run<T, 4, P>(q, k, v, offset, scale, scales, gaussian, out);
    case 8: return run<T, 8, P>(q, k, v, offset, scale, scales, gaussian, out);
    default: return run<T, 0, P>(q, k, v, offset, scale, scales, gaussian, out);
  }
}

template <typename T>
void dispatch(int64_t d, int64_t p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& offset, double scale, const at::Tensor& scales, bool gaussian, at::Tensor& out) {
  switch (p) {
    case 1: return dispatch_d<T, 1>(d, q, k, v, offset, scale, scales, gaussian, out);
    case 2: return dispatch_d<T, 2>(d, q, k, v, offset, scale, scales, gaussian, out);
    case 4: return dispatch_d<T, 4>(d, q, k, v, offset, scale, scales, gaussian, out);
    case 8: return dispatch_d<T, 8>(d, q, k, v, offset, scale, scales, gaussian, out);
    default: return dispatch_d<T, 0>(d, q, k, v, offset, scale, scales, gaussian, out);
  }
}

}  // namespace

at::Tensor nw_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const c10::optional<at::Tensor>& offset, double scale,
                      const c10::optional<at::Tensor>& scales, bool gaussian) {
  // gaussian: the Gaussian kernel's centring and offset from the keys themselves (offset must be
  // None); otherwise the logits are scale·(<q, k> + offset). scales (B, H), any strides: one
  // scale per (b, h) in place of `scale` (a bandwidth per head).
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "nw_forward: q, k, v of rank 4");
  TORCH_CHECK(q.size(3) == k.size(3) && q.size(3) <= 64, "nw_forward: one head dimension, at most 64");
  TORCH_CHECK(k.size(2) == v.size(2) && k.size(2) >= 1, "nw_forward: as many values as keys, at least one");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble, "nw_forward: float32 or float64");
  for (int64_t i = 0; i < 2; ++i)
    TORCH_CHECK(k.size(i) == q.size(i) && v.size(i) == q.size(i), "nw_forward: one (B, H)");
  at::Tensor off;
  if (offset.has_value() && offset->defined()) {
    off = *offset;
    TORCH_CHECK(off.dim() == 3 && off.size(0) == q.size(0) && off.size(1) == q.size(1) && off.size(2) == k.size(2),
                "nw_forward: offset (B, H, n)");
    TORCH_CHECK(off.scalar_type() == q.scalar_type(), "nw_forward: one dtype");
    TORCH_CHECK(!gaussian, "nw_forward: an offset or the Gaussian kernel's own, not both");
  }
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "nw_forward: one dtype");
  at::Tensor sc;
  if (scales.has_value() && scales->defined()) {
    sc = *scales;
    TORCH_CHECK(sc.dim() == 2 && sc.size(0) == q.size(0) && sc.size(1) == q.size(1), "nw_forward: scales (B, H)");
    TORCH_CHECK(sc.scalar_type() == q.scalar_type(), "nw_forward: one dtype");
  }
  auto out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  const int64_t d = q.size(3), p = v.size(3);
  if (q.scalar_type() == at::kFloat) {
    dispatch<float>(d, p, q, k, v, off, scale, sc, gaussian, out);
  } else {
    dispatch<double>(d, p, q, k, v, off, scale, sc, gaussian, out);
  }
  return out;
}

at::Tensor exp2_values(const at::Tensor& x) {
  // nwlib's float32 exp2 (exp2_poly) applied to x: for the accuracy test.
  using Vec = Vectorized<float>;
  TORCH_CHECK(x.dim() == 1 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(0) % Vec::size() == 0,
              "exp2_values: contiguous float32 vector, length a multiple of the vector width");
  auto y = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t i = 0; i < x.size(0); i += Vec::size()) exp2_poly(Vec::loadu(xp + i)).store(yp + i);
  return y;
}

at::Tensor exp_rate(const at::Tensor& x, int64_t repeats, int64_t which) {
  // The machine's exp throughput on a cache-resident buffer: x (threads, len), float32, one row
  // per thread of ATen's pool; each thread exponentiates its row `repeats` times into its row of
  // the result. which: 0 Sleef's 1-ulp exp, 1 ATen's exp_u20, 2 nwlib's exp2_poly (the one
  // nw_forward uses in float32; 2^x, the kernel's logits being in base 2).
  using Vec = Vectorized<float>;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  x.size(1) % Vec::size() == 0,
              "exp_rate: contiguous float32 (threads, len), len a multiple of the vector width");
  TORCH_CHECK(which >= 0 && which <= 2, "exp_rate: which is 0 (Sleef), 1 (exp_u20) or 2 (exp2_poly)");
  auto y = at::empty_like(x);
  const int64_t len = x.size(1);
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, x.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float* src = xp + row * len;
      float* dst = yp + row * len;
      for (int64_t r = 0; r < repeats; ++r) {
        if (which == 2) {
          for (int64_t i = 0; i < len; i += Vec::size()) exp2_poly(Vec::loadu(src + i)).store(dst + i);
        } else if (which == 1) {
          for (int64_t i = 0; i < len; i += Vec::size()) Vec::loadu(src + i).exp_u20().store(dst + i);
        } else {
          for (int64_t i = 0; i < len; i += Vec::size()) Vec::loadu(src + i).exp().store(dst + i);
        }
      }
    }
  });
  return y;
}

namespace {

// One thread's share of mix_rate: per vector of its row one exp2_poly and K fused multiply-adds
// (K - 1 on the loaded vector into independent accumulators, one of the exponential into its own),
// so that the exponentials and the products are free to overlap as far as the cores allow.
template <int K>
float mix_row(const float* src, int64_t len, int64_t repeats) {
  using Vec = Vectorized<float>;
  Vec acc[K];
#pragma GCC unroll 16
  for (int c = 0; c < K; ++c) acc[c] = Vec(0.0f);
  const Vec w(0.999f);
  for (int64_t r = 0; r < repeats; ++r) {
    for (int64_t i = 0; i < len; i += Vec::size()) {
      const Vec x = Vec::loadu(src + i);
      acc[0] = at::vec::fmadd(exp2_poly(x), w, acc[0]);
#pragma GCC unroll 16
      for (int c = 1; c < K; ++c) acc[c] = at::vec::fmadd(x, w, acc[c]);
    }
  }
  Vec total = acc[0];
#pragma GCC unroll 16
  for (int c = 1; c < K; ++c) total = total + acc[c];
  return hsum<float>(total);
}

template <int K>
void mix_rows(const float* xp, float* yp, int64_t rows, int64_t len, int64_t repeats, int64_t fmas) {
  if constexpr (K > 16) {
    TORCH_CHECK(false, "mix_rate: 1 to 16 products per exponential");
  } else if (fmas == K) {
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) yp[row] = mix_row<K>(xp + row * len, len, repeats);
    });
  } else {
    mix_rows<K + 1>(xp, yp, rows, len, repeats, fmas);
  }
}

}  // namespace

at::Tensor mix_rate(const at::Tensor& x, int64_t repeats, int64_t fmas) {
  // The cores' rate for the fused kernel's arithmetic: x (threads, len) float32, one row per
  // thread, each element of a row taken `repeats` times through one exp2_poly and `fmas` fused
  // multiply-adds (2·fmas flops), data in L1 and no other memory traffic. Returns one number per
  // row (the accumulators' sum, so that nothing is optimised away).
  using Vec = Vectorized<float>;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  x.size(1) % Vec::size() == 0,
              "mix_rate: contiguous float32 (threads, len), len a multiple of the vector width");
  TORCH_CHECK(fmas >= 1 && fmas <= 16, "mix_rate: 1 to 16 products per exponential");
  auto y = at::empty({x.size(0)}, x.options());
  mix_rows<1>(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1), repeats, fmas);
  return y;
}
