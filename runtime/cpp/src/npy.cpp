// Minimal .npy reader/writer (little-endian, C order).
#include "norcal/npy.hpp"

#include <cstring>
#include <fstream>
#include <stdexcept>

namespace norcal {

int64_t NpyArray::count() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) {
        man <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Widen or narrow every element to T (one loop for every dtype the tools exchange).
template <class T>
static std::vector<T> converted(const NpyArray& a, const char* what) {
  const int64_t n = a.count();
  std::vector<T> out(n);
  const std::string& d = a.descr;
  if (d == "<f4") for (int64_t i = 0; i < n; ++i) out[i] = T(a.as<float>()[i]);
  else if (d == "<f2") for (int64_t i = 0; i < n; ++i) out[i] = T(half_to_float(a.as<uint16_t>()[i]));
  else if (d == "|u1") for (int64_t i = 0; i < n; ++i) out[i] = T(a.bytes[i]);
  else if (d == "<i8") for (int64_t i = 0; i < n; ++i) out[i] = T(a.as<int64_t>()[i]);
  else if (d == "<i4") for (int64_t i = 0; i < n; ++i) out[i] = T(a.as<int32_t>()[i]);
  else throw std::runtime_error("npy: cannot convert dtype " + d + " to " + what);
  return out;
}

std::vector<float> NpyArray::to_float() const { return converted<float>(*this, "float"); }

std::vector<int64_t> NpyArray::to_int64() const { return converted<int64_t>(*this, "int64"); }

static size_t itemsize(const std::string& d) {
  if (d == "|u1" || d == "|b1") return 1;
  if (d == "<f2") return 2;
  if (d == "<f4" || d == "<i4") return 4;
  if (d == "<i8" || d == "<f8") return 8;
  throw std::runtime_error("npy: unsupported dtype " + d);
}

static std::string field(const std::string& header, const std::string& key) {
  const size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) throw std::runtime_error("npy: header lacks " + key);
  size_t v = header.find(':', k) + 1;
  while (header[v] == ' ') ++v;
  size_t e = v;
  if (header[v] == '\'') e = header.find('\'', v + 1) + 1;
  else if (header[v] == '(') e = header.find(')', v) + 1;
  else e = header.find_first_of(",}", v);
  return header.substr(v, e - v);
}

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open");
  char magic[8];
  f.read(magic, 8);
  if (!f || std::memcmp(magic, "\x93NUMPY", 6) != 0) throw std::runtime_error(path + ": not a .npy file");
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    uint8_t b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    hlen = b[0] | (b[1] << 8);
  } else {
    uint8_t b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  }
  std::string header(hlen, '\0');
  f.read(header.data(), hlen);
  NpyArray a;
  std::string descr = field(header, "descr");
  a.descr = descr.substr(1, descr.size() - 2);
  if (field(header, "fortran_order") != "False") throw std::runtime_error(path + ": Fortran order unsupported");
  const std::string shape = field(header, "shape");
  for (size_t i = 1; i < shape.size();) {
    size_t j = shape.find_first_of(",)", i);
    const std::string tok = shape.substr(i, j - i);
    if (tok.find_first_not_of(' ') != std::string::npos) a.shape.push_back(std::stoll(tok));
    i = j + 1;
  }
  a.bytes.resize(size_t(a.count()) * itemsize(a.descr));
  f.read(reinterpret_cast<char*>(a.bytes.data()), std::streamsize(a.bytes.size()));
  if (!f) throw std::runtime_error(path + ": truncated data");
  return a;
}

void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               const void* data, size_t nbytes) {
  std::string sh = "(";
  for (size_t i = 0; i < shape.size(); ++i) sh += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  sh += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + sh + ", }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot write");
  const uint16_t hl = uint16_t(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  const char hb[2] = {char(hl & 0xff), char(hl >> 8)};
  f.write(hb, 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(static_cast<const char*>(data), std::streamsize(nbytes));
  if (!f) throw std::runtime_error(path + ": write failed");
}

}  // namespace norcal
