// Engine sidecar reading: a small strict JSON parser (what Python's json.dump writes) and the
// metadata rules of norcal.core.contract.input_spec (defaults, positive integers, BGR/RGB).
#include "norcal/sidecar.hpp"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

namespace norcal {

namespace {

struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool boolean = false;
  double number = 0;
  std::string text;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;

  const Json* get(const std::string& key) const {
    for (const auto& [k, v] : members)
      if (k == key) return &v;
    return nullptr;
  }
};

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  Json document() {
    Json v = value(0);
    space();
    if (i_ != s_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  const std::string& s_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(what + " at byte " + std::to_string(i_));
  }
  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  bool word(const char* w) {
    const size_t n = std::char_traits<char>::length(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }

  Json value(int depth) {
    if (depth > 64) fail("nested too deeply");
    space();
    if (i_ >= s_.size()) fail("unexpected end of the file");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Json::kObject;
      if (eat('}')) return v;
      do {
        space();
        if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string key");
        std::string key = string();
        expect(':');
        v.members.emplace_back(std::move(key), value(depth + 1));
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++i_;
      v.kind = Json::kArray;
      if (eat(']')) return v;
      do v.items.push_back(value(depth + 1));
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::kString;
      v.text = string();
    } else if (word("true")) {
      v.kind = Json::kBool;
      v.boolean = true;
    } else if (word("false")) {
      v.kind = Json::kBool;
    } else if (word("null")) {
      v.kind = Json::kNull;
    } else if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
      v.kind = Json::kNumber;
      const size_t start = i_;
      while (i_ < s_.size() && s_[i_] != '\0' && std::strchr("+-.eE0123456789", s_[i_])) ++i_;
      char* end = nullptr;
      const std::string tok = s_.substr(start, i_ - start);
      v.number = std::strtod(tok.c_str(), &end);
      if (end != tok.c_str() + tok.size()) fail("bad number '" + tok + "'");
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return v;
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      u <<= 4;
      if (h >= '0' && h <= '9') u |= unsigned(h - '0');
      else if (h >= 'a' && h <= 'f') u |= unsigned(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') u |= unsigned(h - 'A' + 10);
      else fail("bad \\u escape");
    }
    return u;
  }

  static void utf8(unsigned cp, std::string& out) {
    if (cp < 0x80) {
      out.push_back(char(cp));
    } else if (cp < 0x800) {
      out.push_back(char(0xc0 | (cp >> 6)));
      out.push_back(char(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out.push_back(char(0xe0 | (cp >> 12)));
      out.push_back(char(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(char(0x80 | (cp & 0x3f)));
    } else {
      out.push_back(char(0xf0 | (cp >> 18)));
      out.push_back(char(0x80 | ((cp >> 12) & 0x3f)));
      out.push_back(char(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(char(0x80 | (cp & 0x3f)));
    }
  }

  std::string string() {
    ++i_;  // the opening quote
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated string");
      const char e = s_[i_++];
      switch (e) {
        case '"': case '\\': case '/': out.push_back(e); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          unsigned cp = hex4();
          // Python's json.dump escapes non-ASCII (ensure_ascii): astral code points as pairs
          if (cp >= 0xd800 && cp < 0xdc00 && s_.compare(i_, 2, "\\u") == 0) {
            i_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xdc00 || lo >= 0xe000) fail("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          utf8(cp, out);
          break;
        }
        default: fail(std::string("bad escape '\\") + e + "'");
      }
    }
  }
};

// A metadata value as norcal.core.contract._int reads it: int(float(raw)), positive.
int positive_int(const std::map<std::string, std::string>& meta, const std::string& key, int fallback,
                 const std::string& where) {
  const auto it = meta.find(key);
  if (it == meta.end()) return fallback;
  const std::string& raw = it->second;
  const char* begin = raw.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  while (end && *end && std::isspace(static_cast<unsigned char>(*end))) ++end;
  if (end == begin || *end != '\0' || !std::isfinite(v) || std::fabs(v) > 2e9)
    throw std::runtime_error(where + ": metadata " + key + "='" + raw + "' is not an integer");
  const int n = int(v);  // truncates toward zero, as Python's int()
  if (n <= 0) throw std::runtime_error(where + ": metadata " + key + "='" + raw + "' must be positive");
  return n;
}

// norcal.category_ids as norcal.core.contract.metadata_category_ids reads it: a JSON list of
// integers (written by json.dumps, so integral numbers).
std::vector<int64_t> category_ids(const std::string& raw, const std::string& key, const std::string& where) {
  const std::string bad = where + ": metadata " + key + " is not a JSON list of integers";
  Json doc;
  try {
    doc = Parser(raw).document();
  } catch (const std::runtime_error&) {
    throw std::runtime_error(bad);
  }
  if (doc.kind != Json::kArray) throw std::runtime_error(bad);
  std::vector<int64_t> ids;
  ids.reserve(doc.items.size());
  for (const Json& v : doc.items) {
    // 2^53: beyond it a double no longer holds every integer exactly
    if (v.kind != Json::kNumber || v.number != std::floor(v.number) || std::fabs(v.number) > 9007199254740992.0)
      throw std::runtime_error(bad);
    ids.push_back(int64_t(v.number));
  }
  return ids;
}

}  // namespace

std::string sidecar_path(const std::string& engine_path) { return engine_path + ".json"; }

EngineSidecar parse_engine_sidecar(const std::string& text, const std::string& where) {
  Json doc;
  try {
    doc = Parser(text).document();
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(where + ": not valid JSON (" + e.what() + ")");
  }
  const Json* format = doc.kind == Json::kObject ? doc.get("format") : nullptr;
  if (!format || format->kind != Json::kString || format->text != kSidecarFormat)
    throw std::runtime_error(where + ": not a norcal engine sidecar (format " + kSidecarFormat + " expected)");
  EngineSidecar out;
  out.found = true;
  out.path = where;
  if (const Json* meta = doc.get("metadata")) {
    if (meta->kind != Json::kObject)
      throw std::runtime_error(where + ": 'metadata' must be an object of strings");
    for (const auto& [k, v] : meta->members) {
      if (v.kind != Json::kString)
        throw std::runtime_error(where + ": metadata " + k + " is not a string (ONNX metadata are strings)");
      out.metadata[k] = v.text;
    }
  }
  if (const Json* p = doc.get("precision"); p && p->kind == Json::kString) out.precision = p->text;
  if (const Json* plugins = doc.get("plugins"); plugins && plugins->kind != Json::kNull) {
    if (plugins->kind != Json::kArray)
      throw std::runtime_error(where + ": 'plugins' must be a list of {\"plugin\": name, ...}");
    for (const Json& entry : plugins->items) {
      const Json* name = entry.kind == Json::kObject ? entry.get("plugin") : nullptr;
      if (!name || name->kind != Json::kString || name->text.empty())
        throw std::runtime_error(where + ": 'plugins' entry " + std::to_string(out.plugins.size()) +
                                 " has no 'plugin' name");
      out.plugins.push_back(name->text);
    }
  }
  // the keys and defaults of norcal.core.contract (MIN_SIZE_TEST, ..., DEFAULTS)
  out.min_size = positive_int(out.metadata, "norcal.min_size_test", out.min_size, where);
  out.max_size = positive_int(out.metadata, "norcal.max_size_test", out.max_size, where);
  out.divisibility = positive_int(out.metadata, "norcal.size_divisibility", out.divisibility, where);
  const auto fmt = out.metadata.find("norcal.input_format");
  if (fmt != out.metadata.end() && !fmt->second.empty()) {
    std::string f = fmt->second;
    for (char& c : f) c = char(std::toupper(static_cast<unsigned char>(c)));
    if (f != "BGR" && f != "RGB")
      throw std::runtime_error(where + ": metadata norcal.input_format='" + fmt->second + "' must be BGR or RGB");
    out.input_format = f;
  }
  // norcal.core.contract.RESIZE: this host implements ResizeShortestEdge only, so a letterbox
  // (Ultralytics) model is refused rather than fed wrongly prepared pixels
  if (const auto r = out.metadata.find("norcal.resize");
      r != out.metadata.end() && !r->second.empty() && r->second != "shortest_edge")
    throw std::runtime_error(where + ": metadata norcal.resize='" + r->second +
                             "' is not supported by the C++ host (shortest_edge only): run this model from Python");
  out.num_classes = positive_int(out.metadata, "norcal.num_classes", 0, where);
  const auto ids = out.metadata.find("norcal.category_ids");
  if (ids != out.metadata.end() && !ids->second.empty()) {
    out.category_ids = category_ids(ids->second, ids->first, where);
    // a list of another length maps classes to the wrong categories (or past its end)
    if (out.num_classes && out.category_ids.size() != size_t(out.num_classes))
      throw std::runtime_error(where + ": metadata norcal.category_ids lists " +
                               std::to_string(out.category_ids.size()) + " categories but norcal.num_classes is " +
                               std::to_string(out.num_classes));
  }
  return out;
}

std::vector<int64_t> results_category_ids(const EngineSidecar& sidecar, const std::vector<int64_t>& given,
                                          const std::string& given_name) {
  if (given.empty()) return sidecar.category_ids;  // checked against num_classes when parsed
  if (sidecar.num_classes && given.size() != size_t(sidecar.num_classes))
    throw std::runtime_error(given_name + ": lists " + std::to_string(given.size()) + " categories but " +
                             sidecar.path + " says the model has " + std::to_string(sidecar.num_classes) +
                             " classes");
  return given;
}

EngineSidecar read_engine_sidecar(const std::string& engine_path) {
  const std::string path = sidecar_path(engine_path);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    EngineSidecar none;
    none.path = path;
    return none;
  }
  if (std::filesystem::is_directory(path, ec))
    throw std::runtime_error(path + ": is a directory, not an engine sidecar");
  std::ifstream f(path, std::ios::binary);
  std::ostringstream text;
  // an empty file inserts nothing (failbit): that is bad JSON, reported by the parser
  if (!f || (!(text << f.rdbuf()) && f.peek() != std::char_traits<char>::eof()))
    throw std::runtime_error(path + ": cannot read");
  return parse_engine_sidecar(text.str(), path);
}

}  // namespace norcal
