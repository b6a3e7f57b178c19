// The NMS of a graph exported with nms="host", on the host: the C++ twin of
// runtime/host_nms.py, equal to it bit for bit (float32 arithmetic in the same order).
//
//   rows:    every (class, anchor) (multi-label), each anchor's best class (first of equal
//            maxima) in its class row (best-class), or one row of best scores (agnostic)
//   per row: ONNX Runtime's NonMaxSuppression (score > threshold, by score with ties by lower
//            anchor, suppressed when IoU > the IoU threshold, no-area boxes suppress nothing)
//   then:    the kept scores laid out [rows x anchors], top K (ties by lower index), zero padded;
//            boxes less the letterbox offset, unused slots zeroed
#pragma once

#include <cstdint>
#include <vector>

namespace norcal {

// What the in-graph selection was exported with (HostSelection in host_nms.py). The thresholds
// are float32 because the Python compares in float32 (np.float32(score_thresh), np.float32(iou)).
struct NmsRule {
  bool best_class = false;
  bool agnostic = false;  // one row of best scores; only read with best_class, as in Python
  float score_thresh = 0.f;
  float iou = 0.5f;
  int64_t topk = 100;
};

// One (batch, class) row: boxes [n, 4], scores [n] -> the kept anchors in the order ONNX
// Runtime emits them. limit 0 keeps any number, as the Python's len(kept) == limit never holds.
std::vector<int64_t> nms_row(const float* boxes, const float* scores, int64_t n, float score_thresh,
                             float iou, int64_t limit);

// One image's picks, rule.topk each, zeros in the unused slots.
struct ImagePicks {
  std::vector<float> scores;
  std::vector<int64_t> classes, anchors;
};

// boxes [a, 4], scores [a, c] of one image.
ImagePicks select_image(const float* boxes, const float* scores, int64_t a, int64_t c, const NmsRule& rule);

// The contract's outputs for a batch, k = rule.topk.
struct HostNmsOutputs {
  int64_t b = 0, k = 0, m = 0;
  std::vector<int64_t> num_detections;  // [b]
  std::vector<float> boxes;             // [b, k, 4] in the unpadded image's pixels
  std::vector<float> scores;            // [b, k]
  std::vector<int64_t> classes;         // [b, k]
  std::vector<float> masks;             // [b, k, m] gathered coefficients, or empty
};

// boxes [b, a, 4] and scores [b, a, c] in letterboxed-input pixels, image_sizes [b, 2] (h, w)
// letterboxed into input_h x input_w; coefs [b, a, m] (segment models) or nullptr.
// Throws std::invalid_argument where Python would fail (no anchors to gather, no classes for
// best-class) or on a negative topk.
HostNmsOutputs select(const float* boxes, const float* scores, const float* coefs, int64_t b, int64_t a,
                      int64_t c, int64_t m, const int64_t* image_sizes, int input_h, int input_w,
                      const NmsRule& rule);

}  // namespace norcal
