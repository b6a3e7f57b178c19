// ctest: the host library on hand-computed cases (no framework: a failed CHECK exits 1).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "norcal/host.hpp"
#include "norcal/host_nms.hpp"
#include "norcal/npy.hpp"
#include "norcal/sidecar.hpp"

using namespace norcal;

static int failures = 0;
#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) {                                                   \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                    \
    }                                                                \
  } while (0)

static void test_resized_size() {
  Size2 s = resized_size(480, 640, 800, 1333);
  CHECK(s.h == 800 && s.w == 1067);
  s = resized_size(1000, 3000, 800, 1333);  // capped: 800 * 1333/2400 = 444.3
  CHECK(s.h == 444 && s.w == 1333);
  s = resized_size(333, 500, 320, 512);  // 500 * 320/333 = 480.48
  CHECK(s.h == 320 && s.w == 480);
  s = resized_size(240, 320, 320, 512);  // 320 * 4/3 = 426.67
  CHECK(s.h == 320 && s.w == 427);
}

static void test_resize_hand_computed() {
  // 1x4 row [0,0,255,255] -> 1x2. Scale 2 widens the triangle to support 2: output 0 takes
  // source 0,1,2 with weights .75,.75,.25 (/1.75), so 255*.25/1.75 = 36.4 -> 36; output 1
  // takes 1,2,3 with .25,.75,.75 -> 255*1.5/1.75 = 218.6 -> 219.
  Image in(1, 4, 1);
  const uint8_t px[4] = {0, 0, 255, 255};
  std::memcpy(in.data.data(), px, 4);
  Image out = resize_bilinear_pil(in, 1, 2);
  CHECK(out.h == 1 && out.w == 2);
  CHECK(out.data[0] == 36 && out.data[1] == 219);
  // Upscale 2 -> 4: centres at 0.25, 0.75, 1.25, 1.75 source px: [0, 64, 191, 255] for [0,255]
  // (weights .75/.25 with the edge tap renormalised: 0, .25*255=63.75, .75*255=191.25, 255).
  Image up(1, 2, 1);
  up.data = {0, 255};
  Image o2 = resize_bilinear_pil(up, 1, 4);
  CHECK(o2.data[0] == 0 && o2.data[1] == 64 && o2.data[2] == 191 && o2.data[3] == 255);
  // A constant image stays constant at any size, in both passes.
  Image c(7, 9, 3);
  std::fill(c.data.begin(), c.data.end(), 77);
  Image r = resize_bilinear_pil(c, 13, 4);
  bool flat = true;
  for (uint8_t v : r.data) flat = flat && v == 77;
  CHECK(flat && r.h == 13 && r.w == 4 && r.c == 3);
}

static void test_batch_layout() {
  Image a(32, 48, 3), b(40, 32, 3);
  for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = uint8_t(i % 3 == 0 ? 200 : 10);  // red-ish
  std::fill(b.data.begin(), b.data.end(), 5);
  Batch batch = prepare_batch({a, b}, 32, 1000, true, 32);
  CHECK(batch.b == 2 && batch.h == 64 && batch.w == 64);
  CHECK(batch.image_sizes[0] == 32 && batch.image_sizes[1] == 48);
  CHECK(batch.image_sizes[2] == 40 && batch.image_sizes[3] == 32);
  const size_t plane = 64 * 64;
  CHECK(batch.images[0] == 10.0f);              // channel 0 = blue
  CHECK(batch.images[2 * plane] == 200.0f);     // channel 2 = red
  CHECK(batch.images[47] == 10.0f && batch.images[48] == 0.0f);  // zero padding right of w=48
  CHECK(batch.images[32 * 64] == 0.0f);         // and below h=32
}

static void test_rescale_boxes() {
  float boxes[12] = {-5, 10, 50, 700, 10, 10, 10, 20, 100, 100, 300, 120};
  auto keep = rescale_boxes(boxes, 3, {200, 100}, {400, 300});  // x * 3, y * 2
  CHECK(boxes[0] == 0 && boxes[1] == 20 && boxes[2] == 150 && boxes[3] == 400);
  CHECK(keep[0] == 1 && keep[1] == 0 && keep[2] == 0);
}

static void test_paste_mask() {
  std::vector<float> ones(28 * 28, 1.0f);
  std::vector<uint8_t> out(100, 0);
  const float box[4] = {2, 2, 6, 6};
  paste_mask(ones.data(), 28, box, 10, 10, out.data());
  int inside = 0, total = 0;
  for (int y = 0; y < 10; ++y)
    for (int x = 0; x < 10; ++x) {
      total += out[y * 10 + x];
      inside += (y >= 2 && y < 6 && x >= 2 && x < 6) ? out[y * 10 + x] : 0;
    }
  CHECK(inside == 16 && total == 16);
  // [[1,0],[1,0]] on (0,0,4,4): columns 0,1 at 0.75 (0.5625 on the edge rows), 2,3 <= 0.25
  const float half[4] = {1, 0, 1, 0};
  std::vector<uint8_t> o2(16, 0);
  const float box2[4] = {0, 0, 4, 4};
  paste_mask(half, 2, box2, 4, 4, o2.data());
  bool ok = true;
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) ok = ok && o2[y * 4 + x] == (x < 2 ? 1 : 0);
  CHECK(ok);
}

static void test_rle() {
  // column-major [[0,1],[1,1]] = 0,1,1,1: runs [1, 3] -> "13"
  const uint8_t m[4] = {0, 1, 1, 1};
  CHECK(rle_encode(m, 2, 2) == "13");
  // all ones 2x3: runs [0, 6] -> "06"
  const uint8_t ones[6] = {1, 1, 1, 1, 1, 1};
  CHECK(rle_encode(ones, 2, 3) == "06");
  // a run of 40 = 0b101000: low 5 bits 8 with the continuation bit (8|0x20)+48 = 'X', then 1 -> '1'
  std::vector<uint8_t> z(40, 0);
  CHECK(rle_encode(z.data(), 8, 5) == "X1");
}

static void test_results_json() {
  Detections d;
  d.image_id = "000000000042";
  d.image_size = {4, 4};
  d.boxes = {0, 0, 4, 4};
  d.scores = {0.5f};
  d.classes = {1};
  d.masks = {1, 0, 1, 0};
  d.mask_size = 2;
  std::string js;
  append_results_json(d, {3, 7}, js);
  CHECK(js == "{\"image_id\": 42, \"category_id\": 7, \"bbox\": [0, 0, 4, 4], \"score\": 0.5, "
              "\"segmentation\": {\"size\": [4, 4], \"counts\": \"088\"}}");
  bool threw = false;
  try {
    std::string s;
    append_results_json(d, {3}, s);
  } catch (const std::out_of_range&) {
    threw = true;
  }
  CHECK(threw);
}

static void test_half() {
  CHECK(half_to_float(0x3c00) == 1.0f && half_to_float(0xc000) == -2.0f);
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24) && half_to_float(0x3800) == 0.5f);
}

static void test_nms_row() {
  const float boxes[6 * 4] = {0, 0, 4, 4,  0, 0, 4, 2,  0, 0, 4, 2,  1, 1, 1, 3,  0, 0, 4, 4,  10, 10, 12, 12};
  const float scores[6] = {0.9f, 0.7f, 0.7f, 0.95f, 0.5f, 0.6f};
  // 3 (zero width) is kept first and suppresses nothing, nor is it suppressed; 1 has IoU 8/16 =
  // 0.5 with 0, exactly the threshold, and is kept; 2 ties 1 and loses to the lower anchor, then
  // IoU 1 with it suppresses it; 4's score equals the threshold, so it is no candidate.
  CHECK((nms_row(boxes, scores, 6, 0.5f, 0.5f, 100) == std::vector<int64_t>{3, 0, 1, 5}));
  CHECK((nms_row(boxes, scores, 6, 0.5f, 0.5f, 2) == std::vector<int64_t>{3, 0}));
  CHECK((nms_row(boxes, scores, 6, 0.5f, 0.49f, 100) == std::vector<int64_t>{3, 0, 5}));  // now 0.5 > iou
}

static void test_host_select() {
  // anchors 0 and 1 the same box, 2 apart; anchor 0's classes tie (best class 0)
  const float boxes[3 * 4] = {0, 0, 10, 10,  0, 0, 10, 10,  20, 20, 30, 30};
  const float scores[3 * 2] = {0.6f, 0.6f,  0.2f, 0.8f,  0.6f, 0.1f};
  const float coefs[3] = {1, 2, 3};
  const int64_t sizes[2] = {20, 31};  // in 40 x 40: offset top floor(20/2) = 10, left floor(9/2) = 4
  NmsRule rule{true, false, 0.3f, 0.5f, 3, 0, true};
  // rows [0.6, 0, 0.6] and [0, 0.8, 0], nothing suppressed; top 3 with the 0.6 tie by lower index
  ImagePicks p = select_image(boxes, scores, 3, 2, rule);
  CHECK((p.scores == std::vector<float>{0.8f, 0.6f, 0.6f}));
  CHECK((p.classes == std::vector<int64_t>{1, 0, 0} && p.anchors == std::vector<int64_t>{1, 0, 2}));
  // agnostic: one row [0.6, 0.8, 0.6], 0 suppressed by 1; K = 4 > 3 anchors, so one padded slot
  rule.agnostic = true;
  rule.topk = 4;
  const HostNmsOutputs o = norcal::select({boxes, scores, nullptr, coefs, 1, 3, 2, 1}, sizes, 40, 40, rule);
  CHECK(o.num_detections[0] == 2);
  CHECK((o.scores == std::vector<float>{0.8f, 0.6f, 0, 0} && o.classes == std::vector<int64_t>{1, 0, 0, 0}));
  CHECK((o.boxes == std::vector<float>{-4, -10, 6, 0, 16, 10, 26, 20, 0, 0, 0, 0, 0, 0, 0, 0}));
  CHECK((o.masks == std::vector<float>{2, 3, 0, 0}));
  // multi-label: row 1 keeps anchor 1 and suppresses 0 (IoU 1), row 0 keeps 0 and 2
  rule = NmsRule{false, false, 0.3f, 0.5f, 3};
  p = select_image(boxes, scores, 3, 2, rule);
  CHECK((p.scores == std::vector<float>{0.8f, 0.6f, 0.6f} && p.anchors == std::vector<int64_t>{1, 0, 2}));
}

static bool contains(const std::string& s, const std::string& part);

// The message of the std::invalid_argument that f throws, or "" when it throws none.
template <class F>
static std::string error_of_invalid(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

static void test_host_select_retinanet() {
  // Six candidates of two images (the same boxes and scores), 3 classes, not letterboxed.
  //   0 [0,0,10,10] .9   1 [0,0,10,5] .8 (IoU with 0: 50/100 = .5, exactly the threshold)
  //   2 [1,1,10,10] .7 (IoU with 0: 81/100)   3 [0,0,10,10] .85 (0's box)
  //   4 [20,20,30,30] .3 (equal to the score threshold: no candidate)   5 [40,40,50,50] .8
  const float box6[6 * 4] = {0, 0, 10, 10,  0, 0, 10, 5,    1, 1, 10, 10,
                             0, 0, 10, 10,  20, 20, 30, 30,  40, 40, 50, 50};
  const float sc6[6] = {0.9f, 0.8f, 0.7f, 0.85f, 0.3f, 0.8f};
  std::vector<float> boxes(box6, box6 + 24), scores(sc6, sc6 + 6);
  boxes.insert(boxes.end(), box6, box6 + 24);
  scores.insert(scores.end(), sc6, sc6 + 6);
  // image 0: class rows 0: {3}, 1: {4, 5}, 2: {0, 1, 2}. Row 2 keeps 0, keeps 1 (.5 is not > .5),
  // drops 2 (.81); 3 is kept in its own row though it is 0's box. TopK over [3 x 6]: .9 (row 2,
  // anchor 0), .85 (row 0, 3), then the .8 tie by flat index: row 1 anchor 5 (11) before row 2
  // anchor 1 (13); then two unused slots. image 1: every candidate class 0: one row, by score
  // 0 (.9), 3 (.85, IoU 1 with 0: dropped), 1 and 5 (.8 tie: the lower anchor first; both kept),
  // 2 dropped; classes 0.
  const int64_t classes[12] = {2, 2, 2, 0, 1, 1,  0, 0, 0, 0, 0, 0};
  const NmsRule rule{false, false, 0.3f, 0.5f, 6, 3, false};
  const HostCandidates in{boxes.data(), scores.data(), classes, nullptr, 2, 6, 1, 0};
  const HostNmsOutputs o = norcal::select(in, nullptr, 0, 0, rule);
  CHECK(o.b == 2 && o.k == 6 && o.m == 0 && o.masks.empty());
  CHECK((o.num_detections == std::vector<int64_t>{4, 3}));
  CHECK((o.scores == std::vector<float>{0.9f, 0.85f, 0.8f, 0.8f, 0, 0,  0.9f, 0.8f, 0.8f, 0, 0, 0}));
  CHECK((o.classes == std::vector<int64_t>{2, 0, 1, 2, 0, 0,  0, 0, 0, 0, 0, 0}));
  const std::vector<float> zero(8, 0.f);
  std::vector<float> want = {0, 0, 10, 10,  0, 0, 10, 10,  40, 40, 50, 50,  0, 0, 10, 5};  // as given: no offset
  want.insert(want.end(), zero.begin(), zero.end());
  const std::vector<float> want1 = {0, 0, 10, 10,  0, 0, 10, 5,  40, 40, 50, 50,  0, 0, 0, 0};
  want.insert(want.end(), want1.begin(), want1.end());
  want.insert(want.end(), zero.begin(), zero.end());
  CHECK(o.boxes == want);
  // the label rule is not read for these candidates
  const NmsRule agnostic{true, true, 0.3f, 0.5f, 6, 3, false};
  CHECK(norcal::select(in, nullptr, 0, 0, agnostic).classes == o.classes);
}

static void test_host_select_retinanet_refusals() {
  // a class outside the model's, or no class count, is refused
  const float boxes[2 * 4] = {0, 0, 1, 1,  2, 2, 3, 3};
  const float scores[2] = {0.5f, 0.6f};
  auto refused = [&](std::vector<int64_t> cls, int64_t num_classes) {
    const NmsRule rule{false, false, 0.3f, 0.5f, 6, num_classes, false};
    return error_of_invalid([&] { select_image(boxes, scores, cls.data(), 2, 1, rule); });
  };
  CHECK(refused({0, 2}, 3).empty());
  CHECK(contains(refused({0, 3}, 3), "candidate class 3 of candidate 1 is outside the model's 3 classes"));
  CHECK(contains(refused({-1, 0}, 3), "candidate class -1 of candidate 0 is outside"));
  CHECK(contains(refused({0, 0}, 0), "need num_classes >= 1"));
  // a letterboxed rule needs the image sizes its offset comes from
  const int64_t cls[2] = {0, 1};
  const NmsRule letterboxed{false, false, 0.3f, 0.5f, 6, 2, true};
  const HostCandidates in{boxes, scores, cls, nullptr, 1, 2, 1, 0};
  CHECK(contains(error_of_invalid([&] { norcal::select(in, nullptr, 8, 8, letterboxed); }),
                 "a letterboxed rule needs the image sizes"));
}

// The message of the std::runtime_error that f throws, or "" when it throws none.
template <class F>
static std::string error_of(F f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

static bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

static void test_sidecar_hand_written() {
  // as json.dump writes it: escapes, nested objects, numbers, null; unknown keys ignored
  const std::string text =
      "{\"format\": \"norcal-engine-sidecar/1\", \"engine\": \"m.engine\", \"metadata\": {"
      "\"norcal.min_size_test\": \"640\", \"norcal.max_size_test\": \"1024.0\", "
      "\"norcal.input_format\": \"rgb\", \"norcal.size_divisibility\": \"64\", "
      "\"norcal.detector\": \"{\\\"depth\\\": 50, \\\"name\\\": \\\"caf\\u00e9 \\ud83d\\ude00\\\"}\"}, "
      "\"profile\": {\"images\": {\"min\": [1, 3, 320, 320]}}, \"precision\": \"fp16\", "
      "\"workspace_gb\": null, \"flag\": true, \"ratio\": -1.5e-3}";
  const EngineSidecar s = parse_engine_sidecar(text, "m.engine.json");
  CHECK(s.plugins.empty());
  // the plugins list norcal build writes (tensorrt_targets.plugins_needed)
  const EngineSidecar r = parse_engine_sidecar(
      "{\"format\": \"norcal-engine-sidecar/1\", \"metadata\": {}, \"plugins\": [{\"plugin\": \"ROIAlign_TRT\", "
      "\"library\": \"libnvinfer_plugin\", \"since\": \"8.5\", \"op_type\": \"RoiAlign\", \"nodes\": [\"a\", \"b\"]}]}", "r");
  CHECK(r.plugins == std::vector<std::string>{"ROIAlign_TRT"});
  CHECK(s.found && s.min_size == 640 && s.max_size == 1024 && s.divisibility == 64);
  CHECK(s.input_format == "RGB" && !s.bgr() && s.precision == "fp16");
  CHECK(s.metadata.at("norcal.detector") == "{\"depth\": 50, \"name\": \"caf\xc3\xa9 \xf0\x9f\x98\x80\"}");
  // no size metadata: detectron2's defaults, as norcal.core.contract.DEFAULTS
  const EngineSidecar d = parse_engine_sidecar("{\"format\": \"norcal-engine-sidecar/1\", \"metadata\": {}}", "d");
  CHECK(d.min_size == 800 && d.max_size == 1333 && d.divisibility == 32 && d.bgr());
}

static void test_sidecar_errors() {
  auto parse = [](const std::string& t) { return error_of([&] { parse_engine_sidecar(t, "x.engine.json"); }); };
  const std::string head = "{\"format\": \"norcal-engine-sidecar/1\", \"metadata\": {";
  CHECK(contains(parse("{\"format\": \"norcal-engine-sidecar/1\", "), "x.engine.json: not valid JSON"));
  CHECK(contains(parse("{\"format\": 'single'}"), "not valid JSON"));
  CHECK(contains(parse("{} trailing"), "not valid JSON (unexpected text after the JSON value"));
  CHECK(contains(parse("[1, 2]"), "not a norcal engine sidecar (format norcal-engine-sidecar/1 expected)"));
  CHECK(contains(parse("{\"format\": \"norcal-engine-sidecar/2\"}"), "not a norcal engine sidecar"));
  CHECK(contains(parse("{\"format\": \"norcal-engine-sidecar/1\", \"metadata\": []}"), "'metadata' must be an object"));
  CHECK(contains(parse(head + "\"norcal.min_size_test\": 800}}"), "norcal.min_size_test is not a string"));
  CHECK(contains(parse(head + "\"norcal.min_size_test\": \"big\"}}"), "norcal.min_size_test='big' is not an integer"));
  CHECK(contains(parse(head + "\"norcal.size_divisibility\": \"0\"}}"), "must be positive"));
  CHECK(contains(parse(head + "\"norcal.input_format\": \"YUV\"}}"), "must be BGR or RGB"));
  CHECK(parse(head + "\"norcal.max_size_test\": \" 1333 \"}}").empty());  // int(float(' 1333 '))
  CHECK(contains(parse(head + "\"norcal.resize\": \"letterbox\", \"norcal.input_size\": \"640\"}}"),
                 "norcal.resize='letterbox' is not supported by the C++ host"));
  CHECK(parse(head + "\"norcal.resize\": \"shortest_edge\"}}").empty());
  CHECK(contains(parse(head + "}, \"plugins\": \"ROIAlign_TRT\"}"), "'plugins' must be a list"));
  CHECK(contains(parse(head + "}, \"plugins\": [{\"library\": \"x\"}]}"), "'plugins' entry 0 has no 'plugin' name"));
}

static void test_sidecar_files() {
  // next to the engine: "<engine>.json"; none there means the defaults and found = false
  const std::string engine = "norcal_host_tests_tmp.engine";
  CHECK(sidecar_path(engine) == engine + ".json");
  std::remove(sidecar_path(engine).c_str());
  const EngineSidecar none = read_engine_sidecar(engine);
  CHECK(!none.found && none.min_size == 800 && none.max_size == 1333 && none.bgr());
  {
    std::ofstream f(sidecar_path(engine));
    f << "{\"format\": \"norcal-engine-sidecar/1\", \"metadata\": {\"norcal.min_size_test\": \"512\"}}\n";
  }
  const EngineSidecar s = read_engine_sidecar(engine);
  CHECK(s.found && s.min_size == 512 && s.max_size == 1333 && s.path == sidecar_path(engine));
  {
    std::ofstream f(sidecar_path(engine));  // empty: truncated by a crash, say
  }
  CHECK(contains(error_of([&] { read_engine_sidecar(engine); }), engine + ".json: not valid JSON"));
  std::remove(sidecar_path(engine).c_str());
}

// `norcal_host_tests --sidecar ENGINE MIN MAX FORMAT DIV`: the sidecar the Python builder wrote
// (tests/runtime/test_cpp.py) reads back as the values Python's input_spec gives.
static int check_python_sidecar(char** argv) {
  EngineSidecar s;
  try {
    s = read_engine_sidecar(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  CHECK(s.found);
  CHECK(s.min_size == std::stoi(argv[3]) && s.max_size == std::stoi(argv[4]));
  CHECK(s.input_format == argv[5] && s.divisibility == std::stoi(argv[6]));
  if (failures) std::fprintf(stderr, "%s: read %d %d %s %d\n", s.path.c_str(), s.min_size, s.max_size,
                             s.input_format.c_str(), s.divisibility);
  else std::printf("sidecar %s read as written\n", s.path.c_str());
  return failures ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc == 7 && std::strcmp(argv[1], "--sidecar") == 0) return check_python_sidecar(argv);
  test_resized_size();
  test_resize_hand_computed();
  test_batch_layout();
  test_rescale_boxes();
  test_paste_mask();
  test_rle();
  test_results_json();
  test_half();
  test_nms_row();
  test_host_select();
  test_host_select_retinanet();
  test_host_select_retinanet_refusals();
  test_sidecar_hand_written();
  test_sidecar_errors();
  test_sidecar_files();
  if (failures) std::fprintf(stderr, "%d check(s) failed\n", failures);
  else std::printf("all host checks passed\n");
  return failures ? 1 : 0;
}
