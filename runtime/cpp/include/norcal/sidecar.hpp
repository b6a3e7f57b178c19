// The engine sidecar `<engine>.json` written by `norcal build` (runtime/tensorrt_build.py):
// a TensorRT engine cannot carry the ONNX model's metadata, so the sidecar does. The host
// reads how to prepare images from it, as the Python runtime does (norcal.core.contract).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace norcal {

// The sidecar format this reader understands (SIDECAR_FORMAT in tensorrt_build.py).
inline constexpr const char* kSidecarFormat = "norcal-engine-sidecar/1";

// How to prepare images for one engine, and what else the sidecar says.
struct EngineSidecar {
  bool found = false;          // false: no sidecar next to the engine; detectron2's defaults
  std::string path;            // the sidecar file
  int min_size = 800;          // norcal.min_size_test (ResizeShortestEdge short edge)
  int max_size = 1333;         // norcal.max_size_test (long-edge cap)
  std::string input_format = "BGR";  // norcal.input_format: "BGR" or "RGB"
  int divisibility = 32;       // norcal.size_divisibility (pad H and W to a multiple)
  std::string precision;       // "fp32" / "fp16" as built, or empty
  int num_classes = 0;         // norcal.num_classes, or 0 when not recorded
  // norcal.category_ids: class index -> dataset category id (empty: none recorded, index + 1)
  std::vector<int64_t> category_ids;
  std::map<std::string, std::string> metadata;  // the ONNX model's metadata_props
  // the plugins the engine holds ("plugins": [{"plugin": "ROIAlign_TRT", ...}]): registered
  // (initLibNvInferPlugins) before deserializing; one missing from the registry is refused
  std::vector<std::string> plugins;
  bool bgr() const { return input_format == "BGR"; }
};

// "model.engine" -> "model.engine.json".
std::string sidecar_path(const std::string& engine_path);

// The sidecar next to engine_path; without one, found = false and the defaults (as the Python
// runner, which warns). A sidecar that is not JSON, not of kSidecarFormat, or holds a bad
// value (category ids that are not a JSON list of integers, or whose count is not
// norcal.num_classes) throws std::runtime_error naming the file and what is wrong.
EngineSidecar read_engine_sidecar(const std::string& engine_path);

// The same from a sidecar's text; `where` names it in errors.
EngineSidecar parse_engine_sidecar(const std::string& text, const std::string& where);

// The class index -> category id list results are written with, as the Python runner chooses
// it: `given` (named `given_name` in errors, e.g. a --category-ids file) when not empty, else
// the sidecar's norcal.category_ids; empty when neither has any (index + 1). A list whose
// length is not the sidecar's norcal.num_classes throws.
std::vector<int64_t> results_category_ids(const EngineSidecar& sidecar, const std::vector<int64_t>& given,
                                          const std::string& given_name);

}  // namespace norcal
