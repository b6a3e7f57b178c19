// Minimal .npy I/O (version 1/2 headers, little-endian, C order) so tests and tools can
// exchange arrays with Python without any dependency.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace norcal {

struct NpyArray {
  std::string descr;  // "|u1", "<f4", "<f2", "<i8", "<i4"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  int64_t count() const;
  template <class T> const T* as() const { return reinterpret_cast<const T*>(bytes.data()); }
  std::vector<float> to_float() const;    // from f4, f2, u1, i4, i8
  std::vector<int64_t> to_int64() const;  // from the same (floats truncated)
};

NpyArray read_npy(const std::string& path);
void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               const void* data, size_t nbytes);

float half_to_float(uint16_t h);

}  // namespace norcal
