#include "cachesvc/rpc/server_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cachesvc/rpc/proto_convert.h"
#include "common/status_macros.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "kvcache/v1/config.pb.h"

namespace kvc::cachesvc {

ServerOptions DefaultServerOptions() {
  ServerOptions options;
  PoolOptions pool;
  pool.name = "default";
  pool.capacity_bytes = int64_t{1} << 30;
  pool.geometry.num_layers = 30;
  pool.geometry.num_kv_heads = 3;
  pool.geometry.num_query_heads = 9;
  pool.geometry.head_dim = 64;
  pool.geometry.block_tokens = 16;
  pool.geometry.dtype = DType::kF16;
  pool.geometry.rope.enabled = true;
  pool.geometry.rope.theta = 100000;
  options.store.pools.push_back(pool);
  return options;
}

namespace {

// Collects parser errors into one message a person can act on.
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (!errors_.empty()) errors_ += "; ";
    absl::StrAppend(&errors_, "line ", line + 1, " column ", column + 1, ": ", message);
  }
  const std::string& errors() const { return errors_; }

 private:
  std::string errors_;
};

}  // namespace

absl::StatusOr<ServerOptions> ParseServerConfig(const std::string& text) {
  kvcache::v1::ServerConfig config;
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config is not a valid ServerConfig: ", errors.errors()));
  }
  ServerOptions options;
  if (!config.listen().empty()) options.listen = config.listen();
  options.metrics_listen = config.metrics_listen();
  if (config.max_message_bytes() < 0) {
    return absl::InvalidArgumentError("config max_message_bytes must be >= 0");
  }
  if (config.max_message_bytes() > 0) options.max_message_bytes = config.max_message_bytes();
  if (config.max_sequences() < 0) {
    return absl::InvalidArgumentError("config max_sequences must be >= 0");
  }
  if (config.max_sequences() > 0) options.store.max_sequences = config.max_sequences();
  if (config.pools().empty()) {
    return absl::InvalidArgumentError("config has no pools: add at least one `pools { ... }`");
  }
  for (const auto& pool : config.pools()) {
    KVC_ASSIGN_OR_RETURN(PoolOptions p, FromProto(pool));
    options.store.pools.push_back(p);
  }
  return options;
}

absl::StatusOr<ServerOptions> LoadServerConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config file '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  auto options = ParseServerConfig(text.str());
  if (!options.ok()) {
    return absl::Status(options.status().code(),
                        absl::StrCat(path, ": ", options.status().message()));
  }
  return options;
}

absl::StatusOr<int64_t> ParseByteSize(const std::string& text) {
  absl::string_view s(text.data(), text.size());
  struct Unit {
    const char* suffix;
    double factor;
  };
  static constexpr Unit kUnits[] = {{"TiB", 1099511627776.0},
                                    {"GiB", 1073741824.0},
                                    {"MiB", 1048576.0},
                                    {"KiB", 1024.0},
                                    {"TB", 1e12},
                                    {"GB", 1e9},
                                    {"MB", 1e6},
                                    {"KB", 1e3},
                                    {"B", 1.0}};
  double factor = 1;
  for (const Unit& unit : kUnits) {
    if (absl::ConsumeSuffix(&s, unit.suffix)) {
      factor = unit.factor;
      break;
    }
  }
  double value = 0;
  if (s.empty() || !absl::SimpleAtod(s, &value) || !(value >= 0) || value * factor > 9.2e18) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a byte size; use e.g. 1073741824, 512MiB or 2GiB"));
  }
  return static_cast<int64_t>(std::llround(value * factor));
}

}  // namespace kvc::cachesvc
