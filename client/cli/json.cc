#include "client/cli/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvc::cli {

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '<':  // as protobuf: safe to embed in HTML
        out += "\\u003c";
        break;
      case '>':
        out += "\\u003e";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

Json Json::String(const std::string& s) { return Json(Kind::kScalar, Quote(s)); }
Json Json::Int64(int64_t value) { return Json(Kind::kScalar, absl::StrCat("\"", value, "\"")); }
Json Json::Int32(int32_t value) { return Json(Kind::kScalar, absl::StrCat(value)); }
Json Json::Bool(bool value) { return Json(Kind::kScalar, value ? "true" : "false"); }

Json Json::Double(double value) {
  if (std::isnan(value)) return Json(Kind::kScalar, "\"NaN\"");
  if (std::isinf(value)) return Json(Kind::kScalar, value > 0 ? "\"Infinity\"" : "\"-Infinity\"");
  // protobuf's SimpleDtoa: 15 significant digits when they read back exactly, else 17.
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.15g", value);
  if (std::strtod(buffer, nullptr) != value) {
    std::snprintf(buffer, sizeof(buffer), "%.17g", value);
  }
  return Json(Kind::kScalar, buffer);
}

Json& Json::Add(const std::string& key, Json value) {
  items_.emplace_back(key, std::move(value));
  return *this;
}

Json& Json::Push(Json value) {
  items_.emplace_back("", std::move(value));
  return *this;
}

std::string Json::Render(int pad) const {
  std::string out;
  RenderTo(pad, &out);
  if (pad == 0) out += "\n";
  return out;
}

void Json::RenderTo(int depth, std::string* out) const {
  if (kind_ == Kind::kScalar) {
    *out += text_;
    return;
  }
  const char open = kind_ == Kind::kObject ? '{' : '[';
  const char close = kind_ == Kind::kObject ? '}' : ']';
  *out += open;
  if (items_.empty()) {
    *out += close;
    return;
  }
  for (size_t i = 0; i < items_.size(); ++i) {
    *out += i == 0 ? "\n" : ",\n";
    out->append(depth + 1, ' ');
    if (kind_ == Kind::kObject) absl::StrAppend(out, Quote(items_[i].first), ": ");
    items_[i].second.RenderTo(depth + 1, out);
  }
  *out += "\n";
  out->append(depth, ' ');
  *out += close;
}

}  // namespace kvc::cli
