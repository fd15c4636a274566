// Fused Nadaraya-Watson (softmax attention) forward for small head dimensions, on ATen's
// vectorised exp. out[b, h, i, :] = sum_j w_ij v[b, h, :, j] with w_ij ∝ exp(<q_i, k_j> + bias_j),
// in one pass over the keys with a running maximum (online softmax), so that no (m, n) weight
// matrix is formed. float32 uses exp_u20 (a few ulp; the tests compare with float64 references),
// float64 Sleef's 1-ulp exp. Forward only: nwlib/_fused.py routes autograd to SDPA.
//
// Layout (prepared by nwlib/_fused.py): q (B, H, m, d) with the scale folded in; kt (B, H, d, N)
// keys transposed and N padded to a multiple of the vector width; bias (B, H, N) (-inf on the
// padding); vt (B, H, p, N). The two batch dimensions may have stride 0 (broadcast inputs);
// the last two of every tensor are contiguous. Returns (B, H, m, p) in the inputs' dtype.
#include <torch/extension.h>
#include <c10/macros/Macros.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/cpu/vec/functional.h>
#include <algorithm>
#include <limits>
#include <vector>

namespace {

using at::vec::Vectorized;

template <typename T, bool FAST>
inline Vectorized<T> vexp(const Vectorized<T>& x) {
  if constexpr (FAST && std::is_same_v<T, float>) {
    return x.exp_u20();
  } else {
    return x.exp();
  }
}


// One pass over the keys with a lazily updated running maximum: the accumulators are rescaled
// only when a logit exceeds the current shift by more than HEADROOM, so the exponents are at
// most HEADROOM (e^HEADROOM and n of them are far from overflow in float32) and the rescale,
// a horizontal maximum and one scalar exp, happens a few times per query.
template <typename T>
constexpr T HEADROOM = T(16);

// QT queries per tile: each key vector is loaded once for QT queries; fewer queries per tile
// where each carries P accumulators, so that they stay in registers.
template <int P>
constexpr int64_t queries_per_tile() { return P == 1 ? 4 : P <= 4 ? 2 : 1; }

template <typename T, bool FAST, int D, int P>
void tile(const T* q, int64_t d_rt, const T* kt, const T* bias, const T* vt, int64_t p_rt, int64_t N,
          int64_t nq, T* out, int64_t out_stride_row) {
  using Vec = Vectorized<T>;
  constexpr int64_t W = Vec::size();
  constexpr int64_t QT = queries_per_tile<P>();
  const int64_t d = D > 0 ? D : d_rt;
  const int64_t p = P > 0 ? P : p_rt;
  constexpr T NEG_INF = -std::numeric_limits<T>::infinity();
  constexpr int ALL_LANES = (1 << W) - 1;
  T shift[QT];
  std::vector<Vec> acc_heap(P > 0 ? 0 : QT * p, Vec(T(0)));
  Vec acc_stack[QT][P > 0 ? P : 1];
  Vec sums[QT];
  for (int64_t r = 0; r < QT; ++r) {
    shift[r] = NEG_INF;
    sums[r] = Vec(T(0));
    if constexpr (P > 0)
      for (int64_t c = 0; c < P; ++c) acc_stack[r][c] = Vec(T(0));
  }
  auto acc = [&](int64_t r, int64_t c) -> Vec& {
    if constexpr (P > 0) return acc_stack[r][c]; else return acc_heap[r * p + c];
  };
  for (int64_t j = 0; j < N; j += W) {
    const Vec b = Vec::loadu(bias + j);
    Vec l[QT];
    for (int64_t r = 0; r < QT; ++r) l[r] = b;
    for (int64_t c = 0; c < d; ++c) {
      const Vec kv = Vec::loadu(kt + c * N + j);
      for (int64_t r = 0; r < QT; ++r) l[r] = at::vec::fmadd(Vec(q[r * d + c]), kv, l[r]);
    }
    for (int64_t r = 0; r < QT; ++r) {
      Vec s = Vec(shift[r]);
      // zero_mask: one bit per lane that compares false; all set means no logit is above.
      if (C10_UNLIKELY((l[r] > s + Vec(HEADROOM<T>)).zero_mask() != ALL_LANES)) {
        const T m = at::vec::vec_reduce_all<T>([](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, l[r]);
        if (shift[r] != NEG_INF) {
          const Vec alpha = Vec(std::exp(shift[r] - m));
          sums[r] = sums[r] * alpha;
          for (int64_t c = 0; c < p; ++c) acc(r, c) = acc(r, c) * alpha;
        }
        shift[r] = m;
        s = Vec(m);
      }
      const Vec e = vexp<T, FAST>(l[r] - s);
      sums[r] = sums[r] + e;
      for (int64_t c = 0; c < p; ++c) acc(r, c) = at::vec::fmadd(e, Vec::loadu(vt + c * N + j), acc(r, c));
    }
  }
  for (int64_t r = 0; r < nq; ++r) {
    const T s = at::vec::vec_reduce_all<T>([](Vec& x, Vec& y) { return x + y; }, sums[r]);
    for (int64_t c = 0; c < p; ++c)
      out[r * out_stride_row + c] =
          at::vec::vec_reduce_all<T>([](Vec& x, Vec& y) { return x + y; }, acc(r, c)) / s;
  }
}

template <typename T, bool FAST, int D, int P>
void run(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& bias, const at::Tensor& vt, at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), m = q.size(2), d = q.size(3);
  const int64_t N = kt.size(3), p = vt.size(2);
  constexpr int64_t QT = queries_per_tile<P>();
  const int64_t tiles = (m + QT - 1) / QT;
  const T* qp = q.data_ptr<T>();
  const T* kp = kt.data_ptr<T>();
  const T* bp = bias.data_ptr<T>();
  const T* vp = vt.data_ptr<T>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, B * H * tiles, 1, [&](int64_t begin, int64_t end) {
    alignas(64) T qbuf[QT * 64];  // d <= 64
    for (int64_t t = begin; t < end; ++t) {
      const int64_t bh = t / tiles, i0 = (t % tiles) * QT;
      const int64_t b = bh / H, h = bh % H;
      const int64_t nq = std::min(QT, m - i0);
      const T* qrow = qp + b * q.stride(0) + h * q.stride(1) + i0 * d;
      std::fill(qbuf, qbuf + QT * d, T(0));
      std::copy(qrow, qrow + nq * d, qbuf);
      tile<T, FAST, D, P>(qbuf, d, kp + b * kt.stride(0) + h * kt.stride(1), bp + b * bias.stride(0) + h * bias.stride(1),
                       vp + b * vt.stride(0) + h * vt.stride(1), p, N, nq,
                       op + ((b * H + h) * m + i0) * p, p);
    }
  });
}

template <typename T, bool FAST, int P>
void dispatch_d(int64_t d, const at::Tensor& q, const at::Tensor& kt, const at::Tensor& bias, const at::Tensor& vt,
                at::Tensor& out) {
  switch (d) {
    case 1: return run<T, FAST, 1, P>(q, kt, bias, vt, out);
    case 2: return run<T, FAST, 2, P>(q, kt, bias, vt, out);
    case 4: return run<T, FAST, 4, P>(q, kt, bias, vt, out);
    case 8: return run<T, FAST, 8, P>(q, kt, bias, vt, out);
    default: return run<T, FAST, 0, P>(q, kt, bias, vt, out);
  }
}

template <typename T, bool FAST>
void dispatch(int64_t d, int64_t p, const at::Tensor& q, const at::Tensor& kt, const at::Tensor& bias,
              const at::Tensor& vt, at::Tensor& out) {
  switch (p) {
    case 1: return dispatch_d<T, FAST, 1>(d, q, kt, bias, vt, out);
    case 2: return dispatch_d<T, FAST, 2>(d, q, kt, bias, vt, out);
    case 4: return dispatch_d<T, FAST, 4>(d, q, kt, bias, vt, out);
    case 8: return dispatch_d<T, FAST, 8>(d, q, kt, bias, vt, out);
    default: return dispatch_d<T, FAST, 0>(d, q, kt, bias, vt, out);
  }
}

}  // namespace

at::Tensor nw_forward(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& bias, const at::Tensor& vt) {
  TORCH_CHECK(q.dim() == 4 && kt.dim() == 4 && bias.dim() == 3 && vt.dim() == 4, "nw_forward: ranks");
  TORCH_CHECK(q.size(3) <= 64, "nw_forward: head dimension above 64");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble, "nw_forward: float32 or float64");
  const auto width = q.scalar_type() == at::kFloat ? Vectorized<float>::size() : Vectorized<double>::size();
  TORCH_CHECK(kt.size(3) % width == 0, "nw_forward: keys not padded to the vector width");
  for (const at::Tensor* t : {&q, &kt, &bias, &vt}) {
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), "nw_forward: one dtype");
    TORCH_CHECK(t->stride(-1) == 1, "nw_forward: last dimension not contiguous");
  }
  TORCH_CHECK(q.stride(2) == q.size(3) && kt.stride(2) == kt.size(3) && vt.stride(2) == vt.size(3),
              "nw_forward: rows not contiguous");
  auto out = at::empty({q.size(0), q.size(1), q.size(2), vt.size(2)}, q.options());
  const int64_t d = q.size(3), p = vt.size(2);
  if (q.scalar_type() == at::kFloat) {
    dispatch<float, true>(d, p, q, kt, bias, vt, out);
  } else {
    dispatch<double, false>(d, p, q, kt, bias, vt, out);
  }
  return out;
}

at::Tensor exp_rate(const at::Tensor& x, int64_t repeats, bool fast) {
  // The machine's exp throughput on a cache-resident buffer: x (threads, len), float32, one row
  // per thread of ATen's pool; each thread exponentiates its row `repeats` times into its row of
  // the result (fast: exp_u20, the exp nw_forward uses in float32; otherwise Sleef's 1-ulp exp).
  using Vec = Vectorized<float>;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  x.size(1) % Vec::size() == 0,
              "exp_rate: contiguous float32 (threads, len), len a multiple of the vector width");
  auto y = at::empty_like(x);
  const int64_t len = x.size(1);
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, x.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float* src = xp + row * len;
      float* dst = yp + row * len;
      for (int64_t r = 0; r < repeats; ++r) {
        if (fast) {
          for (int64_t i = 0; i < len; i += Vec::size()) Vec::loadu(src + i).exp_u20().store(dst + i);
        } else {
          for (int64_t i = 0; i < len; i += Vec::size()) Vec::loadu(src + i).exp().store(dst + i);
        }
      }
    }
  });
  return y;
}
