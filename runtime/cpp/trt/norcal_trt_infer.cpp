// norcal-trt-infer: run a norcal TensorRT engine (the ONNX contract) on images and write
// LVIS/COCO results JSON, with the host side from norcal_host.
//
//   norcal-trt-infer ENGINE -o results.json [--min-size N] [--max-size N] [--format BGR|RGB]
//                    [--divisibility N] [--batch 1] [--category-ids ids.txt] IMAGE...
//
// Resize sizes, channel order and padding come from the engine's sidecar ENGINE.json (written
// by `norcal build`, the ONNX model's metadata); the flags override it. Without a sidecar a
// warning says detectron2's defaults (800/1333, BGR, 32) apply, as the Python runner does.
// Images: .npy (RGB uint8 [H,W,3]) or binary .ppm (P6, 8-bit). Image ids are file stems.
// Category ids: the sidecar's norcal.category_ids (class index -> dataset category id), as the
// Python runner uses them; --category-ids ids.txt (the id of class index i on line i, whitespace
// separated is fine) overrides them. Without either, class index + 1.
// NVIDIA's plugin library (libnvinfer_plugin: ROIAlign_TRT for every R-CNN) is registered
// before the engine is deserialized; a plugin the sidecar lists that is still not registered
// is refused in one line.
#include <NvInfer.h>
#include <NvInferPlugin.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "norcal/host.hpp"
#include "norcal/npy.hpp"
#include "norcal/sidecar.hpp"
#include "norcal/tool.hpp"

using namespace norcal;

namespace {

class Logger : public nvinfer1::ILogger {
  void log(Severity severity, const char* msg) noexcept override {
    if (severity <= Severity::kWARNING) std::cerr << "[TensorRT] " << msg << "\n";
  }
};

// The name of a registered plugin creator, whichever interface it implements.
std::string creator_name(nvinfer1::IPluginCreatorInterface* c) {
  const std::string kind = c->getInterfaceInfo().kind;
  if (kind == "PLUGIN CREATOR_V1") return static_cast<nvinfer1::IPluginCreator*>(c)->getPluginName();
  if (kind == "PLUGIN CREATOR_V3ONE") return static_cast<nvinfer1::IPluginCreatorV3One*>(c)->getPluginName();
  return "";
}

// Every plugin the sidecar lists is in the registry, or the engine is refused before loading.
void require_plugins(const EngineSidecar& sidecar) {
  if (sidecar.plugins.empty()) return;
  int32_t n = 0;
  nvinfer1::IPluginCreatorInterface* const* all = getPluginRegistry()->getAllCreators(&n);
  std::vector<std::string> have;
  for (int32_t i = 0; i < n; ++i) have.push_back(creator_name(all[i]));
  for (const std::string& need : sidecar.plugins)
    if (std::find(have.begin(), have.end(), need) == have.end())
      throw std::runtime_error(sidecar.path + ": the engine holds the plugin " + need +
                               ", which is not registered: link libnvinfer_plugin of the TensorRT that built it");
}

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

std::string stem(const std::string& path) {
  const size_t slash = path.find_last_of("/\\");
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const size_t dot = name.find_last_of('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

Image read_ppm(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string magic;
  int w = 0, h = 0, maxv = 0;
  f >> magic;
  auto next_int = [&](int& v) {
    f >> std::ws;
    while (f.peek() == '#') {
      std::string line;
      std::getline(f, line);
      f >> std::ws;
    }
    f >> v;
  };
  next_int(w);
  next_int(h);
  next_int(maxv);
  f.get();
  if (!f || magic != "P6" || maxv != 255 || w <= 0 || h <= 0)
    throw std::runtime_error(path + ": not an 8-bit binary PPM (P6)");
  Image im(h, w, 3);
  f.read(reinterpret_cast<char*>(im.data.data()), std::streamsize(im.data.size()));
  if (!f) throw std::runtime_error(path + ": truncated PPM");
  return im;
}

Image read_image(const std::string& path) {
  if (path.size() > 4 && path.substr(path.size() - 4) == ".npy") {
    NpyArray a = read_npy(path);
    if (a.descr != "|u1" || a.shape.size() != 3 || a.shape[2] != 3)
      throw std::runtime_error(path + ": expected RGB uint8 [H,W,3]");
    Image im(int(a.shape[0]), int(a.shape[1]), 3);
    im.data = std::move(a.bytes);
    return im;
  }
  return read_ppm(path);
}

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  void ensure(size_t n) {
    if (n <= bytes) return;
    if (ptr) cudaFree(ptr);
    cuda_check(cudaMalloc(&ptr, n), "cudaMalloc");
    bytes = n;
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
};

size_t type_size(nvinfer1::DataType t) {
  switch (t) {
    case nvinfer1::DataType::kFLOAT: case nvinfer1::DataType::kINT32: return 4;
    case nvinfer1::DataType::kHALF: return 2;
    case nvinfer1::DataType::kINT64: return 8;
    case nvinfer1::DataType::kBOOL: case nvinfer1::DataType::kUINT8: case nvinfer1::DataType::kINT8: return 1;
    default: throw std::runtime_error("unsupported tensor data type");
  }
}

int64_t volume(const nvinfer1::Dims& d) {
  int64_t v = 1;
  for (int i = 0; i < d.nbDims; ++i) v *= d.d[i];
  return v;
}

// A host copy of one output, converted to float or int64 whatever the engine's type.
struct HostTensor {
  nvinfer1::DataType type;
  nvinfer1::Dims dims;
  std::vector<uint8_t> raw;
  template <class T>
  std::vector<T> to() const {
    const int64_t n = volume(dims);
    std::vector<T> o(n);
    for (int64_t i = 0; i < n; ++i) {
      switch (type) {
        case nvinfer1::DataType::kFLOAT: o[i] = T(reinterpret_cast<const float*>(raw.data())[i]); break;
        case nvinfer1::DataType::kHALF: o[i] = T(half_to_float(reinterpret_cast<const uint16_t*>(raw.data())[i])); break;
        case nvinfer1::DataType::kINT32: o[i] = T(reinterpret_cast<const int32_t*>(raw.data())[i]); break;
        case nvinfer1::DataType::kINT64: o[i] = T(reinterpret_cast<const int64_t*>(raw.data())[i]); break;
        default: throw std::runtime_error("output type not convertible to a number");
      }
    }
    return o;
  }
  std::vector<float> f32() const { return to<float>(); }
  std::vector<int64_t> i64() const { return to<int64_t>(); }
};

int run(int argc, char** argv) {
  std::string engine_path, output;
  int min_size = -1, max_size = -1, divisibility = -1, batch_size = 1;  // -1: from the sidecar
  std::string format, cat_path;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "-o" || a == "--output") output = value();
    else if (a == "--min-size") min_size = std::stoi(value());
    else if (a == "--max-size") max_size = std::stoi(value());
    else if (a == "--divisibility") divisibility = std::stoi(value());
    else if (a == "--batch") batch_size = std::stoi(value());
    else if (a == "--format") format = value();
    else if (a == "--category-ids") cat_path = value();
    else if (a == "-h" || a == "--help") {
      std::cout << "usage: norcal-trt-infer ENGINE -o results.json [--min-size N] [--max-size N] "
                   "[--format BGR|RGB] [--divisibility N] [--batch N] [--category-ids ids.txt] IMAGE...\n"
                   "Images: RGB uint8 .npy [H,W,3] or binary .ppm. Image ids are the file stems.\n"
                   "Sizes, format and divisibility default to the engine's sidecar ENGINE.json.\n";
      return 0;
    } else if (engine_path.empty()) engine_path = a;
    else inputs.push_back(a);
  }
  if (engine_path.empty() || output.empty() || inputs.empty()) throw std::runtime_error("need ENGINE, -o and images (--help)");
  const EngineSidecar sidecar = read_engine_sidecar(engine_path);
  if (!sidecar.found && (min_size < 0 || max_size < 0))
    std::cerr << "warning: " << sidecar.path << " not found (norcal build writes it next to the engine): "
              << "no model metadata, so images are resized to the default " << sidecar.min_size << "/"
              << sidecar.max_size << " unless --min-size/--max-size are given\n";
  if (min_size < 0) min_size = sidecar.min_size;
  if (max_size < 0) max_size = sidecar.max_size;
  if (divisibility < 0) divisibility = sidecar.divisibility;
  if (format.empty()) format = sidecar.input_format;
  if (format != "BGR" && format != "RGB") throw std::runtime_error("--format must be BGR or RGB");
  if (min_size < 1 || max_size < 1 || divisibility < 1)
    throw std::runtime_error("--min-size, --max-size and --divisibility must be >= 1");
  if (batch_size < 1) throw std::runtime_error("--batch must be >= 1");
  std::cerr << "resize " << min_size << "/" << max_size << " " << format << ", pad to a multiple of "
            << divisibility << (sidecar.found ? " (" + sidecar.path + ")" : std::string()) << "\n";
  std::vector<int64_t> cats;
  if (!cat_path.empty()) {
    std::ifstream f(cat_path);
    if (!f) throw std::runtime_error(cat_path + ": cannot open");
    for (int64_t v; f >> v;) cats.push_back(v);
    if (!f.eof() || cats.empty()) throw std::runtime_error(cat_path + ": not a list of integer category ids");
  }
  cats = results_category_ids(sidecar, cats, cat_path);

  std::ifstream ef(engine_path, std::ios::binary);
  if (!ef) throw std::runtime_error(engine_path + ": cannot open");
  const std::vector<char> blob((std::istreambuf_iterator<char>(ef)), std::istreambuf_iterator<char>());
  Logger logger;
  if (!initLibNvInferPlugins(&logger, "")) throw std::runtime_error("could not register libnvinfer_plugin");
  require_plugins(sidecar);
  std::unique_ptr<nvinfer1::IRuntime> runtime(nvinfer1::createInferRuntime(logger));
  std::unique_ptr<nvinfer1::ICudaEngine> engine(runtime->deserializeCudaEngine(blob.data(), blob.size()));
  if (!engine) throw std::runtime_error(engine_path + ": not a TensorRT engine for this TensorRT version/GPU");
  std::unique_ptr<nvinfer1::IExecutionContext> ctx(engine->createExecutionContext());
  std::vector<std::string> outputs;
  for (int i = 0; i < engine->getNbIOTensors(); ++i) {
    const char* name = engine->getIOTensorName(i);
    if (engine->getTensorIOMode(name) == nvinfer1::TensorIOMode::kOUTPUT) outputs.emplace_back(name);
  }
  for (const char* need : {"num_detections", "boxes", "scores", "classes"})
    if (std::find(outputs.begin(), outputs.end(), need) == outputs.end())
      throw std::runtime_error(std::string("engine has no output '") + need + "' (not a norcal contract model)");
  const bool has_masks = std::find(outputs.begin(), outputs.end(), "masks") != outputs.end();
  const nvinfer1::DataType sizes_type = engine->getTensorDataType("image_sizes");

  cudaStream_t stream;
  cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");
  std::map<std::string, DeviceBuffer> dev;
  std::string body;
  size_t done = 0, failed = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t s = 0; s < inputs.size(); s += batch_size) {
    std::vector<Image> ims;
    std::vector<std::string> ids;
    for (size_t i = s; i < std::min(inputs.size(), s + batch_size); ++i) {
      try {
        ims.push_back(read_image(inputs[i]));
        ids.push_back(stem(inputs[i]));
      } catch (const std::exception& e) {
        std::cerr << "skipped " << inputs[i] << ": " << e.what() << "\n";
        ++failed;
      }
    }
    if (ims.empty()) continue;
    const Batch b = prepare_batch(ims, min_size, max_size, format == "BGR", divisibility);
    if (!ctx->setInputShape("images", nvinfer1::Dims4{b.b, 3, b.h, b.w}) ||
        !ctx->setInputShape("image_sizes", nvinfer1::Dims2{b.b, 2}))
      throw std::runtime_error("engine profile does not admit batch " + std::to_string(b.b) + " of " +
                               std::to_string(b.h) + "x" + std::to_string(b.w));
    dev["images"].ensure(b.images.size() * 4);
    cuda_check(cudaMemcpyAsync(dev["images"].ptr, b.images.data(), b.images.size() * 4, cudaMemcpyHostToDevice, stream), "copy images");
    std::vector<int32_t> sizes32(b.image_sizes.begin(), b.image_sizes.end());
    const bool i64 = sizes_type == nvinfer1::DataType::kINT64;
    dev["image_sizes"].ensure(b.image_sizes.size() * 8);
    cuda_check(cudaMemcpyAsync(dev["image_sizes"].ptr, i64 ? static_cast<const void*>(b.image_sizes.data()) : sizes32.data(),
                               b.image_sizes.size() * (i64 ? 8 : 4), cudaMemcpyHostToDevice, stream), "copy image_sizes");
    ctx->setTensorAddress("images", dev["images"].ptr);
    ctx->setTensorAddress("image_sizes", dev["image_sizes"].ptr);
    std::map<std::string, HostTensor> host;
    for (const std::string& name : outputs) {
      HostTensor& t = host[name];
      t.type = engine->getTensorDataType(name.c_str());
      t.dims = ctx->getTensorShape(name.c_str());
      if (volume(t.dims) < 0) throw std::runtime_error("output " + name + " has a data-dependent shape");
      t.raw.resize(size_t(volume(t.dims)) * type_size(t.type));
      dev[name].ensure(std::max<size_t>(t.raw.size(), 1));
      ctx->setTensorAddress(name.c_str(), dev[name].ptr);
    }
    if (!ctx->enqueueV3(stream)) throw std::runtime_error("enqueueV3 failed");
    for (auto& [name, t] : host)
      cuda_check(cudaMemcpyAsync(t.raw.data(), dev[name].ptr, t.raw.size(), cudaMemcpyDeviceToHost, stream), "copy output");
    cuda_check(cudaStreamSynchronize(stream), "synchronize");
    const std::vector<int64_t> num = host["num_detections"].i64(), classes = host["classes"].i64();
    const std::vector<float> boxes = host["boxes"].f32(), scores = host["scores"].f32();
    const std::vector<float> masks = has_masks ? host["masks"].f32() : std::vector<float>();
    const int64_t K = host["scores"].dims.d[1];
    const int m = has_masks ? int(host["masks"].dims.d[3]) : 0;
    for (int i = 0; i < b.b; ++i) {
      const Detections d = postprocess_one(
          std::min<int64_t>(num[i], K), &boxes[size_t(i) * K * 4], &scores[size_t(i) * K], &classes[size_t(i) * K],
          has_masks ? &masks[size_t(i) * K * m * m] : nullptr, m,
          {int(b.image_sizes[2 * i]), int(b.image_sizes[2 * i + 1])},
          {int(b.original_sizes[2 * i]), int(b.original_sizes[2 * i + 1])}, ids[i]);
      append_results_json(d, cats, body);
    }
    done += size_t(b.b);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "\r%zu/%zu images, %.1f images/s", done, inputs.size(), done / std::max(sec, 1e-9));
  }
  cudaStreamDestroy(stream);
  std::fprintf(stderr, "\n");
  const std::string tmp = output + ".tmp";  // atomic: write aside, then rename
  {
    std::ofstream f(tmp);
    f << "[" << body << "]\n";
    if (!f) throw std::runtime_error(tmp + ": write failed");
  }
  if (std::rename(tmp.c_str(), output.c_str()) != 0) throw std::runtime_error("cannot rename onto " + output);
  std::cerr << "wrote " << output << " (" << done << " images";
  if (failed) std::cerr << ", " << failed << " skipped";
  std::cerr << ")\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run_tool(run, argc, argv); }
