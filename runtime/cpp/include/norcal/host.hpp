// Host side of a deployed norcal detector: detectron2's test-time preprocessing and
// postprocessing, reproduced exactly, with only the C++17 standard library.
//
//   resize:      ResizeShortestEdge sizes + PIL's bilinear resampling of uint8 images
//   batch:       channel order, zero padding to a multiple of the divisibility, float32 NCHW
//   postprocess: box rescale/clip/empty-drop (detector_postprocess) and mask pasting
//                (paste_masks_in_image: grid_sample bilinear, align_corners=False, >= 0.5)
//   results:     COCO compressed RLE and LVIS/COCO results JSON
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace norcal {

// An interleaved uint8 image [h, w, c] (c = 3 for RGB/BGR).
struct Image {
  int h = 0, w = 0, c = 3;
  std::vector<uint8_t> data;
  Image() = default;
  Image(int h_, int w_, int c_ = 3) : h(h_), w(w_), c(c_), data(size_t(h_) * w_ * c_) {}
  uint8_t* at(int y, int x) { return data.data() + (size_t(y) * w + x) * c; }
  const uint8_t* at(int y, int x) const { return data.data() + (size_t(y) * w + x) * c; }
};

struct Size2 {
  int h = 0, w = 0;
};

// detectron2 ResizeShortestEdge.get_output_shape: (new_h, new_w).
Size2 resized_size(int h, int w, int min_size, int max_size);

// PIL Image.resize(..., BILINEAR) on uint8: a triangle filter whose support grows with the
// downscale factor (antialiasing), coefficients in 22-bit fixed point, horizontal pass first.
Image resize_bilinear_pil(const Image& in, int new_h, int new_w);

// One model input batch (the ONNX contract).
struct Batch {
  int b = 0, h = 0, w = 0;
  std::vector<float> images;          // [b, 3, h, w], zero padded
  std::vector<int64_t> image_sizes;   // [b, 2] resized (h, w) before padding
  std::vector<int64_t> original_sizes;  // [b, 2]
};

// RGB uint8 images -> resized, channel-ordered (bgr: reverse RGB), zero-padded float32 batch.
Batch prepare_batch(const std::vector<Image>& rgb, int min_size, int max_size, bool bgr = true,
                    int divisibility = 32);

// Boxes [n, 4] (x0, y0, x1, y1) in place: resized coords -> original coords, clipped.
// Returns keep flags: positive width and height (detectron2 drops the rest).
std::vector<uint8_t> rescale_boxes(float* boxes, int n, Size2 resized, Size2 original);

// Paste one square mask [m, m] (probabilities) at box (original coords) into a zeroed
// full-image mask out [img_h, img_w] (row-major, 0/1).
void paste_mask(const float* mask, int m, const float* box, int img_h, int img_w, uint8_t* out,
                float threshold = 0.5f);

// COCO compressed RLE string (pycocotools' rleEncode + rleToString) of a row-major 0/1 mask.
std::string rle_encode(const uint8_t* mask, int h, int w);

// One image's detections in original image coordinates.
struct Detections {
  std::string image_id;  // written as a JSON number when all digits, else a string
  Size2 image_size;
  std::vector<float> boxes;    // [n, 4]
  std::vector<float> scores;   // [n]
  std::vector<int64_t> classes;  // [n]
  std::vector<float> masks;    // [n, m, m] or empty
  int mask_size = 0;
  size_t size() const { return scores.size(); }
};

// Model outputs of one batch item -> detections: first num rows, rescaled, empties dropped.
Detections postprocess_one(int64_t num, const float* boxes, const float* scores,
                           const int64_t* classes, const float* masks, int mask_size,
                           Size2 resized, Size2 original, std::string image_id);

// Results JSON entries (no surrounding brackets), comma-separated, appended to out.
// category_ids: class index -> category id (empty: index + 1; an engine's come from its sidecar,
// results_category_ids in sidecar.hpp). Throws on an out-of-range class.
void append_results_json(const Detections& det, const std::vector<int64_t>& category_ids,
                         std::string& out, bool with_masks = true);

}  // namespace norcal
