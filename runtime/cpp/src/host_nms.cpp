// Host NMS, the twin of runtime/host_nms.py; every float32 step is the NumPy one, in its order.
#include "norcal/host_nms.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace norcal {

// np.minimum / np.maximum: a NaN in either argument is the result (std::min would drop one).
static float np_min(float a, float b) { return (a < b || a != a) ? a : b; }
static float np_max(float a, float b) { return (a > b || a != a) ? a : b; }

// _suppressed_by for one pair: IoU(box, other) > iou in ONNX Runtime's order of operations; no
// area (box, other, intersection or union) suppresses nothing. One float32 operation per
// statement: clang contracts a*b+c into an FMA only within a statement, GCC not at all in ISO
// mode (CMAKE_CXX_EXTENSIONS OFF), so the roundings stay NumPy's.
static bool suppresses(const float* box, const float* other, float iou) {
  const float lo0 = np_min(box[0], box[2]), hi0 = np_max(box[0], box[2]);
  const float lo1 = np_min(box[1], box[3]), hi1 = np_max(box[1], box[3]);
  const float olo0 = np_min(other[0], other[2]), ohi0 = np_max(other[0], other[2]);
  const float olo1 = np_min(other[1], other[3]), ohi1 = np_max(other[1], other[3]);
  const float d1 = np_min(hi1, ohi1) - np_max(lo1, olo1);
  const float d0 = np_min(hi0, ohi0) - np_max(lo0, olo0);
  const float inter = np_max(d1, 0.f) * np_max(d0, 0.f);
  const float area = (hi1 - lo1) * (hi0 - lo0);
  const float other_area = (ohi1 - olo1) * (ohi0 - olo0);
  const float sum = area + other_area;
  const float uni = sum - inter;
  if (!(inter > 0.f && area > 0.f && other_area > 0.f && uni > 0.f)) return false;
  const float ratio = inter / uni;
  return ratio > iou;
}

std::vector<int64_t> nms_row(const float* boxes, const float* scores, int64_t n, float score_thresh,
                             float iou, int64_t limit) {
  std::vector<int64_t> order;
  for (int64_t i = 0; i < n; ++i)
    if (scores[i] > score_thresh) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return scores[x] > scores[y]; });
  // A candidate survives when no box kept before it suppresses it: the Python marks the later
  // ones from each kept box instead, which leaves the same survivors.
  std::vector<int64_t> kept;
  for (int64_t j : order) {
    bool alive = true;
    for (size_t q = 0; q < kept.size() && alive; ++q) alive = !suppresses(boxes + 4 * kept[q], boxes + 4 * j, iou);
    if (!alive) continue;
    kept.push_back(j);
    if (int64_t(kept.size()) == limit) break;
  }
  return kept;
}

// _rows: dense [r, a], the scores NMS runs over per row, and each anchor's class
struct Rows {
  int64_t r = 0;
  std::vector<float> dense;
  std::vector<int64_t> label;
};

// A RetinaNet's candidates: each placed in its class row (zeros elsewhere), labelled by its class.
static Rows candidate_rows(const float* scores, const int64_t* classes, int64_t a, int64_t num_classes) {
  if (num_classes < 1) throw std::invalid_argument("host NMS: a RetinaNet's candidates need num_classes >= 1");
  Rows w{num_classes, std::vector<float>(num_classes * a, 0.f), std::vector<int64_t>(classes, classes + a)};
  for (int64_t i = 0; i < a; ++i) {
    if (classes[i] < 0 || classes[i] >= num_classes)
      throw std::invalid_argument("host NMS: candidate class " + std::to_string(classes[i]) + " of candidate " +
                                  std::to_string(i) + " is outside the model's " + std::to_string(num_classes) +
                                  " classes");
    w.dense[classes[i] * a + i] = scores[i];
  }
  return w;
}

// A YOLO's class scores [a, c] by the label rule (label 0 for multi-label, where only an
// agnostic rule would read it, as in Python).
static Rows yolo_rows(const float* scores, int64_t a, int64_t c, const NmsRule& rule) {
  if (rule.best_class && c < 1) throw std::invalid_argument("host NMS: best-class needs at least one class");
  Rows w{c, {}, std::vector<int64_t>(a, 0)};
  if (!rule.best_class) {
    w.dense.resize(c * a);
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < c; ++j) w.dense[j * a + i] = scores[i * c + j];
    return w;
  }
  std::vector<float> conf(a);
  for (int64_t i = 0; i < a; ++i) {
    const float* s = scores + i * c;
    int64_t best = 0;  // ArgMax: the first of equal maxima, or the first NaN (as NumPy)
    for (int64_t j = 1; j < c && s[best] == s[best]; ++j)
      if (s[j] > s[best] || s[j] != s[j]) best = j;
    w.label[i] = best;
    conf[i] = s[best];
  }
  if (rule.agnostic) {
    w.r = 1;
    w.dense = std::move(conf);
  } else {
    // zeros elsewhere in the row, which are candidates too under a negative threshold
    w.dense.assign(c * a, 0.f);
    for (int64_t i = 0; i < a; ++i) w.dense[w.label[i] * a + i] = conf[i];
  }
  return w;
}

ImagePicks select_image(const float* boxes, const float* scores, const int64_t* classes, int64_t a, int64_t c,
                        const NmsRule& rule) {
  if (rule.topk < 0) throw std::invalid_argument("host NMS: topk must not be negative");
  const Rows w = classes ? candidate_rows(scores, classes, a, rule.num_classes) : yolo_rows(scores, a, c, rule);
  const int64_t n = w.r * a;
  std::vector<float> kept(n, 0.f);
  for (int64_t row = 0; row < w.r; ++row) {
    const float* d = w.dense.data() + row * a;
    for (int64_t anchor : nms_row(boxes, d, a, rule.score_thresh, rule.iou, rule.topk))
      kept[row * a + anchor] = d[anchor];
  }
  // ONNX TopK over [rows x anchors]: by score, ties by lower index (a total order, so
  // partial_sort gives the stable argsort's first k)
  const int64_t k = std::min(rule.topk, n);
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), int64_t(0));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t x, int64_t y) {
    return kept[x] > kept[y] || (kept[x] == kept[y] && x < y);
  });
  ImagePicks p{std::vector<float>(rule.topk, 0.f), std::vector<int64_t>(rule.topk, 0),
               std::vector<int64_t>(rule.topk, 0)};
  for (int64_t s = 0; s < k; ++s) {
    const int64_t i = idx[s], row = i / a, anchor = i % a;
    p.scores[s] = kept[i];
    p.classes[s] = rule.agnostic ? w.label[anchor] : row;
    p.anchors[s] = anchor;
  }
  return p;
}

// Image i's picks gathered into the outputs' slots; boxes less `offset` (the letterbox's, or
// none: then no subtraction at all, as the Python's).
static void gather(const HostCandidates& in, int64_t i, const ImagePicks& p, const float* offset,
                   HostNmsOutputs& o) {
  for (int64_t s = 0; s < o.k; ++s) {
    // unused slots: multiplied by 0 rather than set, so that every bit is NumPy's
    const size_t slot = i * o.k + s;
    const bool keep = p.scores[s] > 0.f;
    const float keep_f = keep ? 1.f : 0.f;
    const float* box = in.boxes + (i * in.a + p.anchors[s]) * 4;
    o.num_detections[i] += keep;
    for (int d = 0; d < 4; ++d) o.boxes[slot * 4 + d] = (offset ? box[d] - offset[d] : box[d]) * keep_f;
    o.scores[slot] = p.scores[s] * keep_f;
    o.classes[slot] = p.classes[s] * keep;
    for (int64_t j = 0; j < o.m; ++j) o.masks[slot * o.m + j] = in.coefs[(i * in.a + p.anchors[s]) * in.m + j] * keep_f;
  }
}

HostNmsOutputs select(const HostCandidates& in, const int64_t* image_sizes, int input_h, int input_w,
                      const NmsRule& rule) {
  if (in.a < 1 && rule.topk > 0) throw std::invalid_argument("host NMS: no anchors to gather boxes from");
  if (rule.letterbox && !image_sizes) throw std::invalid_argument("host NMS: a letterboxed rule needs the image sizes");
  HostNmsOutputs o;
  o.b = in.b, o.k = rule.topk, o.m = in.coefs ? in.m : 0;
  const size_t bk = in.b * o.k;
  o.num_detections.assign(in.b, 0);
  o.boxes.assign(bk * 4, 0.f);
  o.scores.assign(bk, 0.f);
  o.classes.assign(bk, 0);
  o.masks.assign(bk * o.m, 0.f);
  const float h = float(input_h), w = float(input_w);
  const int64_t stride = in.classes ? in.a : in.a * in.c;  // a RetinaNet's scores are [b, a]
  for (int64_t i = 0; i < in.b; ++i) {
    const int64_t* cls = in.classes ? in.classes + i * in.a : nullptr;
    const ImagePicks p = select_image(in.boxes + i * in.a * 4, in.scores + i * stride, cls, in.a, in.c, rule);
    // the letterbox's centring offset, in float32 as the Python: floor((S - size) / 2)
    const float top = rule.letterbox ? std::floor((h - float(image_sizes[2 * i])) / 2.f) : 0.f;
    const float left = rule.letterbox ? std::floor((w - float(image_sizes[2 * i + 1])) / 2.f) : 0.f;
    const float offset[4] = {left, top, left, top};
    gather(in, i, p, rule.letterbox ? offset : nullptr, o);
  }
  return o;
}

}  // namespace norcal
