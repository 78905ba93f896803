// RandomId: "<prefix><32 hex digits>", 128 bits from the kernel's random generator
// (getrandom(2)). The ids kvcached makes for callers (sequences, leases, transfers) are
// capabilities' names: a tenant that saw some of them must learn nothing of the others, so
// they are drawn independently, never derived from a counter (a counter behind an invertible
// mix let a tenant compute the ids another tenant got in between).
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace kvc {

// Never fails: getrandom blocks only until the kernel's pool is first seeded at boot, and an
// error there (a kernel without getrandom) ends the process rather than hand out weak ids.
std::string RandomId(absl::string_view prefix);

}  // namespace kvc
