// The NMS of a graph exported with nms="host", on the host: the C++ twin of
// runtime/host_nms.py, equal to it bit for bit (float32 arithmetic in the same order).
//
// Two layouts, decided as the Python decides them, by whether candidate classes are given:
//   YOLO:      candidate_boxes [B, A, 4], candidate_scores [B, A, C] (candidate_coefs [B, A, M])
//   RetinaNet: candidate_boxes [B, R, 4], candidate_scores [B, R], candidate_classes [B, R]
//              (detectron2, torchvision: the levels' top (anchor, class) pairs)
//
//   rows:    every (class, anchor) (multi-label), each anchor's best class (first of equal
//            maxima) in its class row (best-class), or one row of best scores (agnostic); a
//            RetinaNet's candidate placed in its class row (num_classes rows; the label rule
//            is not read)
//   per row: ONNX Runtime's NonMaxSuppression (score > threshold, by score with ties by lower
//            anchor, suppressed when IoU > the IoU threshold, no-area boxes suppress nothing)
//   then:    the kept scores laid out [rows x anchors], top K (ties by lower index), zero padded;
//            boxes less the letterbox offset where the rule is letterboxed, unused slots zeroed
#pragma once

#include <cstdint>
#include <vector>

namespace norcal {

// What the in-graph selection was exported with (HostSelection in host_nms.py, the same fields
// in the same order). The thresholds are float32 because the Python compares in float32
// (np.float32(score_thresh), np.float32(iou)).
struct NmsRule {
  bool best_class = false;
  bool agnostic = false;  // one row of best scores; only read with best_class, as in Python
  float score_thresh = 0.f;
  float iou = 0.5f;
  int64_t topk = 100;
  int64_t num_classes = 0;  // the class rows of a RetinaNet's candidates (norcal.num_classes); YOLO: unread
  // the image centred in a padded square (the model's norcal.resize is letterbox: its rule
  // pads): boxes less its offset. A RetinaNet (shortest_edge, torchvision) is not.
  bool letterbox = false;
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

// boxes [a, 4] of one image; YOLO: scores [a, c], classes nullptr; RetinaNet: scores [a] and
// classes [a] (each in [0, rule.num_classes), else std::invalid_argument), c unread.
ImagePicks select_image(const float* boxes, const float* scores, const int64_t* classes, int64_t a, int64_t c,
                        const NmsRule& rule);
inline ImagePicks select_image(const float* boxes, const float* scores, int64_t a, int64_t c, const NmsRule& rule) {
  return select_image(boxes, scores, nullptr, a, c, rule);
}

// A host-NMS graph's candidates for a batch of b images (see the layouts above).
struct HostCandidates {
  const float* boxes = nullptr;      // [b, a, 4]: letterboxed-input pixels (YOLO), input pixels (RetinaNet)
  const float* scores = nullptr;     // [b, a, c] (YOLO) or [b, a] (RetinaNet)
  const int64_t* classes = nullptr;  // [b, a] a RetinaNet's candidate_classes; nullptr: the YOLO layout
  const float* coefs = nullptr;      // [b, a, m] (segment models) or nullptr
  int64_t b = 0, a = 0, c = 0, m = 0;
};

// The contract's outputs for a batch, k = rule.topk.
struct HostNmsOutputs {
  int64_t b = 0, k = 0, m = 0;
  std::vector<int64_t> num_detections;  // [b]
  std::vector<float> boxes;             // [b, k, 4] in the unpadded image's pixels
  std::vector<float> scores;            // [b, k]
  std::vector<int64_t> classes;         // [b, k]
  std::vector<float> masks;             // [b, k, m] gathered coefficients, or empty
};

// select in host_nms.py. image_sizes [b, 2] (h, w) letterboxed into input_h x input_w: read
// only where rule.letterbox (nullptr will do otherwise). Throws std::invalid_argument where
// Python would fail (no anchors to gather, no classes for best-class, a candidate class outside
// the rule's num_classes), on a negative topk, or on a letterboxed rule without image sizes.
HostNmsOutputs select(const HostCandidates& in, const int64_t* image_sizes, int input_h, int input_w,
                      const NmsRule& rule);

}  // namespace norcal
