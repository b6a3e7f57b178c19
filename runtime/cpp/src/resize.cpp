// detectron2's test-time resize: ResizeShortestEdge sizes and PIL's uint8 bilinear filter.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "norcal/host.hpp"

namespace norcal {

Size2 resized_size(int h, int w, int min_size, int max_size) {
  if (h <= 0 || w <= 0 || min_size <= 0 || max_size <= 0)
    throw std::invalid_argument("resized_size: sizes must be positive");
  const double size = min_size;
  double scale = size / std::min(h, w);
  double newh, neww;
  if (h < w) {
    newh = size;
    neww = scale * w;
  } else {
    newh = scale * h;
    neww = size;
  }
  if (std::max(newh, neww) > max_size) {
    scale = max_size / std::max(newh, neww);
    newh *= scale;
    neww *= scale;
  }
  return {int(newh + 0.5), int(neww + 0.5)};
}

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // PIL's fixed point for 8-bit images

// Per output pixel: first source index, tap count, and fixed-point weights (ksize each).
struct Coeffs {
  int ksize = 0;
  std::vector<int> start, count;
  std::vector<int32_t> k;
};

double triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// PIL precompute_coeffs + normalize_coeffs_8bpc for the bilinear filter (support 1).
Coeffs coeffs(int in_size, int out_size) {
  Coeffs c;
  double scale = double(in_size) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;  // widen the filter when shrinking
  const double support = 1.0 * filterscale;
  c.ksize = int(std::ceil(support)) * 2 + 1;
  c.start.resize(out_size);
  c.count.resize(out_size);
  c.k.assign(size_t(out_size) * c.ksize, 0);
  std::vector<double> w(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = int(center - support + 0.5);  // C truncation, as PIL
    if (xmin < 0) xmin = 0;
    int xmax = int(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      w[x] = triangle((x + xmin - center + 0.5) * ss);
      ww += w[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? w[x] / ww : w[x];
      c.k[size_t(xx) * c.ksize + x] =
          v < 0 ? int32_t(-0.5 + v * (1 << kPrecisionBits)) : int32_t(0.5 + v * (1 << kPrecisionBits));
    }
    c.start[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

inline uint8_t clip8(int32_t v) {
  v >>= kPrecisionBits;  // arithmetic shift: floor, as PIL's lookup index
  return uint8_t(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// One horizontal pass: rows [row0, row0 + rows) of in -> rows x new_w (uint8, rounded).
Image horizontal_pass(const Image& in, int row0, int rows, const Coeffs& cf, int new_w) {
  const int ch = in.c;
  Image out(rows, new_w, ch);
  for (int y = 0; y < rows; ++y) {
    for (int xx = 0; xx < new_w; ++xx) {
      const int32_t* k = &cf.k[size_t(xx) * cf.ksize];
      const uint8_t* src = in.at(y + row0, cf.start[xx]);
      for (int c = 0; c < ch; ++c) {
        int32_t ss = 1 << (kPrecisionBits - 1);
        for (int x = 0; x < cf.count[xx]; ++x) ss += int32_t(src[x * ch + c]) * k[x];
        out.at(y, xx)[c] = clip8(ss);
      }
    }
  }
  return out;
}

// One vertical pass: output row yy reads rows start[yy] - row_shift ... of in.
Image vertical_pass(const Image& in, const Coeffs& cf, int row_shift, int new_h) {
  const int ch = in.c;
  Image out(new_h, in.w, ch);
  for (int yy = 0; yy < new_h; ++yy) {
    const int32_t* k = &cf.k[size_t(yy) * cf.ksize];
    const int y0 = cf.start[yy] - row_shift;
    for (int xx = 0; xx < in.w; ++xx) {
      for (int c = 0; c < ch; ++c) {
        int32_t ss = 1 << (kPrecisionBits - 1);
        for (int y = 0; y < cf.count[yy]; ++y) ss += int32_t(in.at(y0 + y, xx)[c]) * k[y];
        out.at(yy, xx)[c] = clip8(ss);
      }
    }
  }
  return out;
}

}  // namespace

Image resize_bilinear_pil(const Image& in, int new_h, int new_w) {
  if (new_h <= 0 || new_w <= 0) throw std::invalid_argument("resize: target size must be positive");
  if (in.h == new_h && in.w == new_w) return in;
  const bool need_h = new_w != in.w, need_v = new_h != in.h;
  if (!need_h) return vertical_pass(in, coeffs(in.h, new_h), 0, new_h);
  if (!need_v) return horizontal_pass(in, 0, in.h, coeffs(in.w, new_w), new_w);
  const Coeffs cv = coeffs(in.h, new_h), chz = coeffs(in.w, new_w);
  // Pillow (ImagingResampleInner, since PR #9549) runs the vertical pass first when the
  // height shrinks more than twice as much as the width; each pass rounds to uint8, so
  // the order changes pixels by up to one level and must match.
  const bool vertical_first = in.h >= new_h && (in.h - new_h) > (in.w - new_w) * 2;
  if (vertical_first) return horizontal_pass(vertical_pass(in, cv, 0, new_h), 0, new_h, chz, new_w);
  // Horizontal first, over only the source rows the vertical pass reads (as PIL).
  const int y_first = cv.start[0];
  const int y_last = cv.start[new_h - 1] + cv.count[new_h - 1];
  return vertical_pass(horizontal_pass(in, y_first, y_last - y_first, chz, new_w), cv, y_first, new_h);
}

Batch prepare_batch(const std::vector<Image>& rgb, int min_size, int max_size, bool bgr,
                    int divisibility) {
  if (rgb.empty()) throw std::invalid_argument("prepare_batch: no images");
  std::vector<Image> resized;
  resized.reserve(rgb.size());
  int mh = 0, mw = 0;
  for (const Image& im : rgb) {
    if (im.c != 3 || im.h <= 0 || im.w <= 0) throw std::invalid_argument("prepare_batch: need RGB HxWx3 images");
    const Size2 s = resized_size(im.h, im.w, min_size, max_size);
    resized.push_back(resize_bilinear_pil(im, s.h, s.w));
    mh = std::max(mh, s.h);
    mw = std::max(mw, s.w);
  }
  const int d = std::max(divisibility, 1);
  Batch b;
  b.b = int(rgb.size());
  b.h = (mh + d - 1) / d * d;
  b.w = (mw + d - 1) / d * d;
  b.images.assign(size_t(b.b) * 3 * b.h * b.w, 0.0f);
  for (int i = 0; i < b.b; ++i) {
    const Image& r = resized[i];
    for (int c = 0; c < 3; ++c) {
      const int src_c = bgr ? 2 - c : c;
      float* plane = &b.images[(size_t(i) * 3 + c) * b.h * b.w];
      for (int y = 0; y < r.h; ++y)
        for (int x = 0; x < r.w; ++x) plane[size_t(y) * b.w + x] = r.at(y, x)[src_c];
    }
    b.image_sizes.insert(b.image_sizes.end(), {r.h, r.w});
    b.original_sizes.insert(b.original_sizes.end(), {rgb[i].h, rgb[i].w});
  }
  return b;
}

}  // namespace norcal
