// norcal-host: the C++ host library on .npy files, for tests and for checking a deployment
// against the Python runtime.
//
//   norcal-host size H W MIN MAX                       -> prints "new_h new_w"
//   norcal-host resize IN.npy OUT.npy NEW_H NEW_W      uint8 [H,W,C] -> uint8 resized
//   norcal-host batch PREFIX MIN MAX BGR|RGB DIV IN.npy...  -> PREFIX_images.npy, PREFIX_sizes.npy
//   norcal-host rescale BOXES.npy RH RW OH OW OUT.npy KEEP.npy
//   norcal-host paste MASKS.npy BOXES.npy H W OUT.npy  masks [N,M,M], boxes [N,4] -> uint8 [N,H,W]
//   norcal-host results OUT.json IMAGE_ID RH RW OH OW NUM BOXES.npy SCORES.npy CLASSES.npy
//                       [MASKS.npy|-] [CATEGORY_IDS.npy|ENGINE]   (ENGINE: its sidecar's ids)
//   norcal-host sidecar ENGINE                         -> prints "MIN MAX FORMAT DIV" from ENGINE.json
//   norcal-host categories ENGINE [IDS.npy]            -> prints the category ids results use:
//                                                         IDS (checked against the sidecar) or the sidecar's
//   norcal-host nms BOXES.npy SCORES.npy SIZES.npy S multi|best|agnostic SCORE_THRESH IOU TOPK PREFIX [COEFS.npy]
//   norcal-host nms --classes CLASSES.npy NUM_CLASSES BOXES.npy SCORES.npy SCORE_THRESH IOU TOPK PREFIX
//                       host NMS (host_nms.hpp) of a YOLO's or (--classes) a RetinaNet's candidates
//                       -> PREFIX_num_detections, PREFIX_boxes, PREFIX_scores, PREFIX_classes (PREFIX_masks).npy;
//                       norcal-host nms --help says what each input is
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "norcal/host.hpp"
#include "norcal/host_nms.hpp"
#include "norcal/npy.hpp"
#include "norcal/sidecar.hpp"
#include "norcal/tool.hpp"

using namespace norcal;

static Image load_image(const std::string& path) {
  NpyArray a = read_npy(path);
  if (a.descr != "|u1" || a.shape.size() != 3) throw std::runtime_error(path + ": expected uint8 [H,W,C]");
  Image im(int(a.shape[0]), int(a.shape[1]), int(a.shape[2]));
  im.data = a.bytes;
  return im;
}

// "[3,5,4]"; -1 (any size) as "*"
static std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + (shape[i] < 0 ? "*" : std::to_string(shape[i]));
  return s + "]";
}

// A float32 array of shape `want` (-1: any size), read from path unless `a` is it already: the
// NMS is float32 arithmetic, so another dtype would not give the Python's bits.
static NpyArray load_f32(const std::string& path, const char* what, const std::vector<int64_t>& want,
                         NpyArray a = {}) {
  if (a.descr.empty()) a = read_npy(path);
  bool ok = a.descr == "<f4" && a.shape.size() == want.size();
  for (size_t i = 0; ok && i < want.size(); ++i) ok = want[i] < 0 || a.shape[i] == want[i];
  if (!ok)
    throw std::runtime_error(path + ": " + what + " must be float32 " + shape_str(want) + ", got " + a.descr + " " +
                             shape_str(a.shape));
  return a;
}

static int usage() {
  std::cerr << "usage: norcal-host size|resize|batch|rescale|paste|results|sidecar|categories|nms ... "
               "(see the source header; norcal-host nms --help)\n";
  return 2;
}

static const char* const NMS_USAGE =
    "usage: norcal-host nms BOXES.npy SCORES.npy SIZES.npy S multi|best|agnostic SCORE_THRESH IOU TOPK PREFIX "
    "[COEFS.npy]\n"
    "       norcal-host nms --classes CLASSES.npy NUM_CLASSES BOXES.npy SCORES.npy SCORE_THRESH IOU TOPK PREFIX\n";

static const char* const NMS_HELP =
    "\nThe NMS of a graph exported with --nms host, on its candidates saved as .npy: runtime/host_nms.py's\n"
    "select, bit for bit. The layout is the inputs': candidate classes given (--classes) is a RetinaNet's,\n"
    "none a YOLO's.\n"
    "\nYOLO (letterboxed: boxes less each image's centring offset in the S x S square)\n"
    "  BOXES.npy     candidate_boxes    float32 [B,A,4], letterboxed-input pixels\n"
    "  SCORES.npy    candidate_scores   float32 [B,A,C]\n"
    "  SIZES.npy     image_sizes        int32/int64 [B,2], (h, w) of each image before letterboxing\n"
    "  S             the letterbox square's side (norcal.input_size)\n"
    "  multi|best|agnostic   the recorded label rule: every (class, anchor); each anchor's best class;\n"
    "                best classes in one class-agnostic row\n"
    "  COEFS.npy     candidate_coefs    float32 [B,A,M] (segment models) -> also PREFIX_masks.npy\n"
    "\nRetinaNet (detectron2, torchvision: the levels' top candidates; not letterboxed, boxes as given)\n"
    "  CLASSES.npy   candidate_classes  int32/int64 [B,R], each in [0, NUM_CLASSES)\n"
    "  NUM_CLASSES   the model's norcal.num_classes: one NMS row per class, each candidate in its own\n"
    "  BOXES.npy     candidate_boxes    float32 [B,R,4], input pixels\n"
    "  SCORES.npy    candidate_scores   float32 [B,R]\n"
    "\nBoth\n"
    "  SCORE_THRESH IOU TOPK   norcal.detector's score_thresh_test, nms_thresh_test, detections_per_image\n"
    "                (the thresholds rounded once to float32, as np.float32 does)\n"
    "  PREFIX        writes PREFIX_num_detections.npy int64 [B], PREFIX_boxes.npy float32 [B,K,4],\n"
    "                PREFIX_scores.npy float32 [B,K], PREFIX_classes.npy int64 [B,K] (K = TOPK)\n"
    "\nA missing input, another dtype or shape, or a class out of range is refused in one line (exit 2).\n";

// An integer array of shape `want` (image sizes, candidate classes), read as int64.
static std::vector<int64_t> load_int(const std::string& path, const char* what, const std::vector<int64_t>& want) {
  const NpyArray a = read_npy(path);
  if ((a.descr != "<i8" && a.descr != "<i4") || a.shape != want)
    throw std::runtime_error(path + ": " + what + " must be int " + shape_str(want) + ", got " + a.descr + " " +
                             shape_str(a.shape));
  return a.to_int64();
}

// The argument `what` (its text) as a number, an integer where `integer`, or a one-line refusal.
static double number_arg(const char* text, const char* what, bool integer) {
  size_t used = 0;
  double v = 0;
  try {
    v = integer ? double(std::stoll(text, &used)) : std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (!used || text[used])
    throw std::runtime_error(std::string("nms: ") + what + " must be " + (integer ? "an integer" : "a number") +
                             ", got '" + text + "'");
  return v;
}

// SCORE_THRESH IOU TOPK at argv[at..at+2]: the thresholds parsed as double and rounded once to
// float32, as np.float32(score_thresh) does.
static NmsRule nms_thresholds(char** argv, int at) {
  NmsRule rule;
  rule.score_thresh = float(number_arg(argv[at], "SCORE_THRESH", false));
  rule.iou = float(number_arg(argv[at + 1], "IOU", false));
  rule.topk = int64_t(number_arg(argv[at + 2], "TOPK", true));
  return rule;
}

static void write_nms(const std::string& prefix, const HostNmsOutputs& o, bool masks) {
  const int64_t B = o.b;
  write_npy(prefix + "_num_detections.npy", "<i8", {B}, o.num_detections.data(), o.num_detections.size() * 8);
  write_npy(prefix + "_boxes.npy", "<f4", {B, o.k, 4}, o.boxes.data(), o.boxes.size() * 4);
  write_npy(prefix + "_scores.npy", "<f4", {B, o.k}, o.scores.data(), o.scores.size() * 4);
  write_npy(prefix + "_classes.npy", "<i8", {B, o.k}, o.classes.data(), o.classes.size() * 8);
  if (masks) write_npy(prefix + "_masks.npy", "<f4", {B, o.k, o.m}, o.masks.data(), o.masks.size() * 4);
}

// nms BOXES SCORES SIZES S RULE SCORE_THRESH IOU TOPK PREFIX [COEFS]: a YOLO's, letterboxed.
static int nms_yolo(int argc, char** argv) {
  const NpyArray boxes = load_f32(argv[2], "candidate boxes", {-1, -1, 4});
  const int64_t B = boxes.shape[0], A = boxes.shape[1];
  NpyArray scores = read_npy(argv[3]);
  if (scores.shape.size() == 2)
    throw std::runtime_error(std::string(argv[3]) + ": candidate scores [B,R] are a RetinaNet's: give its candidate "
                             "classes (norcal-host nms --classes CLASSES.npy NUM_CLASSES ...)");
  load_f32(argv[3], "candidate scores", {B, A, -1}, scores);
  const std::vector<int64_t> sizes = load_int(argv[4], "image sizes", {B, 2});
  const std::string how = argv[6];
  if (how != "multi" && how != "best" && how != "agnostic")
    throw std::runtime_error("rule must be multi, best or agnostic, got '" + how + "'");
  NmsRule rule = nms_thresholds(argv, 7);
  rule.best_class = how != "multi";
  rule.agnostic = how == "agnostic";
  rule.letterbox = true;  // a YOLO's norcal.resize is letterbox: its rule pads
  NpyArray coefs;
  if (argc == 12) coefs = load_f32(argv[11], "candidate coefficients", {B, A, -1});
  HostCandidates in{boxes.as<float>(), scores.as<float>(), nullptr, argc == 12 ? coefs.as<float>() : nullptr,
                    B, A, scores.shape[2], argc == 12 ? coefs.shape[2] : 0};
  const int s = int(number_arg(argv[5], "S", true));
  write_nms(argv[10], norcal::select(in, sizes.data(), s, s, rule), argc == 12);
  return 0;
}

// nms --classes CLASSES NUM_CLASSES BOXES SCORES SCORE_THRESH IOU TOPK PREFIX: a RetinaNet's,
// not letterboxed (its resize, shortest_edge or torchvision's, pads nothing).
static int nms_retinanet(char** argv) {
  const NpyArray boxes = load_f32(argv[5], "candidate boxes", {-1, -1, 4});
  const int64_t B = boxes.shape[0], R = boxes.shape[1];
  NpyArray scores = read_npy(argv[6]);
  if (scores.shape.size() == 3)
    throw std::runtime_error(std::string(argv[6]) + ": candidate scores [B,A,C] are a YOLO's, which has no candidate "
                             "classes: run norcal-host nms without --classes");
  load_f32(argv[6], "candidate scores", {B, R}, scores);
  const std::vector<int64_t> classes = load_int(argv[3], "candidate classes", {B, R});
  NmsRule rule = nms_thresholds(argv, 7);
  rule.num_classes = int64_t(number_arg(argv[4], "NUM_CLASSES", true));
  HostCandidates in{boxes.as<float>(), scores.as<float>(), classes.data(), nullptr, B, R, 1, 0};
  write_nms(argv[10], norcal::select(in, nullptr, 0, 0, rule), false);
  return 0;
}

static int nms(int argc, char** argv) {
  if (argc == 3 && (std::strcmp(argv[2], "--help") == 0 || std::strcmp(argv[2], "-h") == 0)) {
    std::cout << NMS_USAGE << NMS_HELP;
    return 0;
  }
  const bool retinanet = argc > 2 && std::strcmp(argv[2], "--classes") == 0;
  if (retinanet ? argc != 11 : (argc != 11 && argc != 12)) {
    const std::string forms(NMS_USAGE);
    const size_t second = forms.find('\n') + 1;  // the usage's line of this layout, less "usage: "
    const std::string form = retinanet ? forms.substr(second, forms.size() - second - 1)
                                       : forms.substr(0, second - 1);
    throw std::runtime_error("nms: expected " + form.substr(form.find("norcal-host")) + ", got " +
                             std::to_string(argc - 2) + " arguments after nms (norcal-host nms --help)");
  }
  return retinanet ? nms_retinanet(argv) : nms_yolo(argc, argv);
}

static int run(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  auto arg_i = [&](int i) { return std::stoi(argv[i]); };
  if (cmd == "size" && argc == 6) {
    const Size2 s = resized_size(arg_i(2), arg_i(3), arg_i(4), arg_i(5));
    std::printf("%d %d\n", s.h, s.w);
  } else if (cmd == "resize" && argc == 6) {
    const Image out = resize_bilinear_pil(load_image(argv[2]), arg_i(4), arg_i(5));
    write_npy(argv[3], "|u1", {out.h, out.w, out.c}, out.data.data(), out.data.size());
  } else if (cmd == "batch" && argc >= 8) {
    std::vector<Image> ims;
    for (int i = 7; i < argc; ++i) ims.push_back(load_image(argv[i]));
    const std::string fmt = argv[5];
    if (fmt != "BGR" && fmt != "RGB") throw std::runtime_error("format must be BGR or RGB");
    const Batch b = prepare_batch(ims, arg_i(3), arg_i(4), fmt == "BGR", arg_i(6));
    const std::string prefix = argv[2];
    write_npy(prefix + "_images.npy", "<f4", {b.b, 3, b.h, b.w}, b.images.data(), b.images.size() * 4);
    write_npy(prefix + "_sizes.npy", "<i8", {b.b, 2}, b.image_sizes.data(), b.image_sizes.size() * 8);
  } else if (cmd == "rescale" && argc == 9) {
    std::vector<float> boxes = read_npy(argv[2]).to_float();
    const int n = int(boxes.size() / 4);
    const std::vector<uint8_t> keep = rescale_boxes(boxes.data(), n, {arg_i(3), arg_i(4)}, {arg_i(5), arg_i(6)});
    write_npy(argv[7], "<f4", {n, 4}, boxes.data(), boxes.size() * 4);
    write_npy(argv[8], "|u1", {n}, keep.data(), keep.size());
  } else if (cmd == "paste" && argc == 7) {
    const NpyArray ma = read_npy(argv[2]);
    const std::vector<float> masks = ma.to_float(), boxes = read_npy(argv[3]).to_float();
    const int n = int(ma.shape[0]), m = int(ma.shape[2]), H = arg_i(4), W = arg_i(5);
    std::vector<uint8_t> out(size_t(n) * H * W, 0);
    for (int i = 0; i < n; ++i)
      paste_mask(&masks[size_t(i) * m * m], m, &boxes[4 * i], H, W, &out[size_t(i) * H * W]);
    write_npy(argv[6], "|u1", {n, H, W}, out.data(), out.size());
  } else if (cmd == "results" && (argc == 13 || argc == 14)) {
    const std::vector<float> boxes = read_npy(argv[9]).to_float(), scores = read_npy(argv[10]).to_float();
    const std::vector<int64_t> classes = read_npy(argv[11]).to_int64();
    std::vector<float> masks;
    int m = 0;
    if (std::strcmp(argv[12], "-") != 0) {
      const NpyArray ma = read_npy(argv[12]);
      masks = ma.to_float();
      m = int(ma.shape.back());
    }
    std::vector<int64_t> cats;
    const std::string ids = argc == 14 ? argv[13] : "";
    if (ids.size() > 4 && ids.compare(ids.size() - 4, 4, ".npy") == 0) {
      cats = read_npy(ids).to_int64();
    } else if (!ids.empty()) {
      const EngineSidecar s = read_engine_sidecar(ids);
      if (!s.found) throw std::runtime_error(s.path + ": no such file");
      cats = results_category_ids(s, {}, "");
    }
    const Detections d = postprocess_one(std::stoll(argv[8]), boxes.data(), scores.data(), classes.data(),
                                         masks.empty() ? nullptr : masks.data(), m, {arg_i(4), arg_i(5)},
                                         {arg_i(6), arg_i(7)}, argv[3]);
    std::string body;
    append_results_json(d, cats, body);
    std::ofstream f(argv[2]);
    f << "[" << body << "]\n";
    if (!f) throw std::runtime_error(std::string(argv[2]) + ": write failed");
  } else if (cmd == "sidecar" && argc == 3) {
    const EngineSidecar s = read_engine_sidecar(argv[2]);
    if (!s.found) throw std::runtime_error(s.path + ": no such file");
    std::printf("%d %d %s %d\n", s.min_size, s.max_size, s.input_format.c_str(), s.divisibility);
  } else if (cmd == "categories" && (argc == 3 || argc == 4)) {
    const EngineSidecar s = read_engine_sidecar(argv[2]);
    if (!s.found) throw std::runtime_error(s.path + ": no such file");
    const std::vector<int64_t> ids =
        results_category_ids(s, argc == 4 ? read_npy(argv[3]).to_int64() : std::vector<int64_t>{},
                             argc == 4 ? argv[3] : "");
    for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %lld" : "%lld", (long long)ids[i]);
    std::printf("\n");
  } else if (cmd == "nms") {
    return nms(argc, argv);
  } else {
    return usage();
  }
  return 0;
}

int main(int argc, char** argv) { return run_tool(run, argc, argv); }
