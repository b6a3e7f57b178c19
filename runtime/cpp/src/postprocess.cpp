// detectron2's detector_postprocess (boxes) and paste_masks_in_image (masks), on the host.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "norcal/host.hpp"

namespace norcal {

std::vector<uint8_t> rescale_boxes(float* boxes, int n, Size2 resized, Size2 original) {
  // float32 scale factors, as torch multiplies a float32 tensor by a Python float
  const float sx = float(double(original.w) / resized.w);
  const float sy = float(double(original.h) / resized.h);
  const float W = float(original.w), H = float(original.h);
  std::vector<uint8_t> keep(n);
  for (int i = 0; i < n; ++i) {
    float* b = boxes + 4 * i;
    b[0] = std::clamp(b[0] * sx, 0.0f, W);
    b[2] = std::clamp(b[2] * sx, 0.0f, W);
    b[1] = std::clamp(b[1] * sy, 0.0f, H);
    b[3] = std::clamp(b[3] * sy, 0.0f, H);
    keep[i] = (b[2] - b[0] > 0.0f) && (b[3] - b[1] > 0.0f);
  }
  return keep;
}

namespace {

// grid_sample(align_corners=False) source coordinate of pixel p along one axis:
// g = (p + 0.5 - lo) / (hi - lo) * 2 - 1;  src = ((g + 1) * m - 1) / 2   (float32 throughout)
struct Tap {
  int i0;
  float w0, w1;  // weights of cells i0 and i0 + 1 (0 when outside the mask: zero padding)
};

std::vector<Tap> taps(float lo, float hi, int start, int stop, int m) {
  std::vector<Tap> t(std::max(stop - start, 0));
  for (int p = start; p < stop; ++p) {
    const float g = (float(p) + 0.5f - lo) / (hi - lo) * 2.0f - 1.0f;
    const float src = ((g + 1.0f) * float(m) - 1.0f) / 2.0f;
    const float f = std::floor(src);
    const int i0 = int(f);
    const float frac = src - f;
    Tap& tp = t[p - start];
    tp.i0 = i0;
    tp.w0 = (i0 >= 0 && i0 < m) ? 1.0f - frac : 0.0f;
    tp.w1 = (i0 + 1 >= 0 && i0 + 1 < m) ? frac : 0.0f;
  }
  return t;
}

}  // namespace

void paste_mask(const float* mask, int m, const float* box, int img_h, int img_w, uint8_t* out,
                float threshold) {
  const float x0 = box[0], y0 = box[1], x1 = box[2], y1 = box[3];
  // Outside floor(box)-1 .. ceil(box)+1 every sample is below 0.5 (detectron2's skip_empty).
  const int xs = std::max(int(std::floor(x0)) - 1, 0), ys = std::max(int(std::floor(y0)) - 1, 0);
  const int xe = std::min(int(std::ceil(x1)) + 1, img_w), ye = std::min(int(std::ceil(y1)) + 1, img_h);
  if (xe <= xs || ye <= ys) return;
  const std::vector<Tap> tx = taps(x0, x1, xs, xe, m), ty = taps(y0, y1, ys, ye, m);
  auto cell = [&](int r, int c) { return (r >= 0 && r < m && c >= 0 && c < m) ? mask[r * m + c] : 0.0f; };
  for (int y = ys; y < ye; ++y) {
    const Tap& a = ty[y - ys];
    uint8_t* row = out + size_t(y) * img_w;
    for (int x = xs; x < xe; ++x) {
      const Tap& b = tx[x - xs];
      const float v = a.w0 * (b.w0 * cell(a.i0, b.i0) + b.w1 * cell(a.i0, b.i0 + 1)) +
                      a.w1 * (b.w0 * cell(a.i0 + 1, b.i0) + b.w1 * cell(a.i0 + 1, b.i0 + 1));
      row[x] = v >= threshold ? 1 : 0;
    }
  }
}

Detections postprocess_one(int64_t num, const float* boxes, const float* scores,
                           const int64_t* classes, const float* masks, int mask_size,
                           Size2 resized, Size2 original, std::string image_id) {
  if (num < 0) throw std::invalid_argument("postprocess: negative num_detections");
  std::vector<float> b(boxes, boxes + 4 * num);
  const std::vector<uint8_t> keep = rescale_boxes(b.data(), int(num), resized, original);
  Detections d;
  d.image_id = std::move(image_id);
  d.image_size = original;
  d.mask_size = masks ? mask_size : 0;
  const size_t mm = size_t(mask_size) * mask_size;
  for (int64_t i = 0; i < num; ++i) {
    if (!keep[i]) continue;
    d.boxes.insert(d.boxes.end(), b.begin() + 4 * i, b.begin() + 4 * i + 4);
    d.scores.push_back(scores[i]);
    d.classes.push_back(classes[i]);
    if (masks) d.masks.insert(d.masks.end(), masks + i * mm, masks + (i + 1) * mm);
  }
  return d;
}

}  // namespace norcal
