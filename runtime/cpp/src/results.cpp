// COCO RLE and results JSON, byte-compatible with pycocotools' encoding.
#include <cstdio>
#include <stdexcept>

#include "norcal/host.hpp"

namespace norcal {

std::string rle_encode(const uint8_t* mask, int h, int w) {
  // Run lengths over the column-major (Fortran) pixel order, starting with a run of zeros.
  std::vector<uint32_t> counts;
  uint8_t prev = 0;
  uint32_t run = 0;
  for (int x = 0; x < w; ++x) {
    for (int y = 0; y < h; ++y) {
      const uint8_t v = mask[size_t(y) * w + x] ? 1 : 0;
      if (v != prev) {
        counts.push_back(run);
        run = 0;
        prev = v;
      }
      ++run;
    }
  }
  counts.push_back(run);
  // pycocotools rleToString: deltas against the count two back (from the 4th on),
  // then 5-bit groups with a continuation bit, offset by '0'.
  std::string s;
  for (size_t i = 0; i < counts.size(); ++i) {
    long long x = counts[i];
    if (i > 2) x -= counts[i - 2];
    bool more = true;
    while (more) {
      char c = char(x & 0x1f);
      x >>= 5;
      more = (c & 0x10) ? x != -1 : x != 0;
      if (more) c |= 0x20;
      s.push_back(char(c + 48));
    }
  }
  return s;
}

namespace {

std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string json_string(const std::string& text) {
  std::string s = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') s.push_back('\\');
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      s += buf;
    } else {
      s.push_back(c);
    }
  }
  return s + "\"";
}

std::string json_id(const std::string& id) {
  bool digits = !id.empty() && id.size() < 19;
  for (char c : id) digits = digits && c >= '0' && c <= '9';
  return digits ? std::to_string(std::stoll(id)) : json_string(id);
}

}  // namespace

void append_results_json(const Detections& det, const std::vector<int64_t>& category_ids,
                         std::string& out, bool with_masks) {
  const int H = det.image_size.h, W = det.image_size.w;
  std::vector<uint8_t> canvas;
  const bool masks = with_masks && det.mask_size > 0 && !det.masks.empty();
  if (masks) canvas.resize(size_t(H) * W);
  const std::string id = json_id(det.image_id);
  const size_t mm = size_t(det.mask_size) * det.mask_size;
  for (size_t i = 0; i < det.size(); ++i) {
    const int64_t c = det.classes[i];
    int64_t cat = c + 1;  // detectron2's LVIS default without a mapping
    if (!category_ids.empty()) {
      if (c < 0 || c >= int64_t(category_ids.size()))
        throw std::out_of_range("class index " + std::to_string(c) + " out of range: " +
                                std::to_string(category_ids.size()) + " category ids known");
      cat = category_ids[size_t(c)];
    }
    const float* b = &det.boxes[4 * i];
    if (!out.empty()) out += ",\n";
    out += "{\"image_id\": " + id + ", \"category_id\": " + std::to_string(cat) + ", \"bbox\": [" +
           num(b[0]) + ", " + num(b[1]) + ", " + num(b[2] - b[0]) + ", " + num(b[3] - b[1]) +
           "], \"score\": " + num(det.scores[i]);
    if (masks) {
      std::fill(canvas.begin(), canvas.end(), 0);
      paste_mask(&det.masks[i * mm], det.mask_size, b, H, W, canvas.data());
      out += ", \"segmentation\": {\"size\": [" + std::to_string(H) + ", " + std::to_string(W) +
             "], \"counts\": " + json_string(rle_encode(canvas.data(), H, W)) + "}";  // may hold '\\'
    }
    out += "}";
  }
}

}  // namespace norcal
