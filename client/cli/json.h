// A small JSON writer for kvcachectl's --json: objects (keys in insertion order), arrays and
// scalars, rendered as protobuf's JSON printer renders with add_whitespace (one space of indent
// per level, "key": value, a newline at the end), so the output of kvcachectl, now built from
// the client library's types, reads as it did when it printed kvcache.v1 messages.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvc::cli {

class Json {
 public:
  static Json Object() { return Json(Kind::kObject, ""); }
  static Json Array() { return Json(Kind::kArray, ""); }
  static Json String(const std::string& s);
  // As protobuf writes each: int64 as a quoted decimal, int32 bare, doubles as the shortest of
  // %.15g / %.17g that reads back the same ("NaN", "Infinity" quoted), enums by name.
  static Json Int64(int64_t value);
  static Json Int32(int32_t value);
  static Json Bool(bool value);
  static Json Double(double value);
  static Json Enum(const char* name) { return String(name); }

  // Appends a member (objects) or an element (arrays); returns *this.
  Json& Add(const std::string& key, Json value);
  Json& Push(Json value);

  // `pad` spaces of indent before every line but the first; a newline at the end when `pad`
  // is 0 (a whole document).
  std::string Render(int pad = 0) const;

 private:
  enum class Kind { kScalar, kObject, kArray };
  Json(Kind kind, std::string text) : kind_(kind), text_(std::move(text)) {}
  void RenderTo(int depth, std::string* out) const;

  Kind kind_;
  std::string text_;                                 // kScalar: the rendered value
  std::vector<std::pair<std::string, Json>> items_;  // keys empty in arrays
};

// `s` as a JSON string literal, escaped as protobuf escapes it.
std::string Quote(const std::string& s);

}  // namespace kvc::cli
