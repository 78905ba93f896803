// Plain-text tables and human byte sizes for kvcachectl.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvc::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Left-aligned columns separated by two spaces; one line per row.
  std::string Render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// 1536 -> "1.5 KiB"; exact bytes below 1 KiB.
std::string FormatBytes(int64_t bytes);

}  // namespace kvc::cli
