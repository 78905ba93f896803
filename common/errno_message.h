// The message of the calling thread's errno ("Connection refused"), for errors that name what a
// system call said. Header-only, so the client library (which installs it with its package)
// and kvcached share one definition instead of a copy per file.
#pragma once

#include <cerrno>
#include <string>
#include <system_error>

namespace kvc {

inline std::string ErrnoMessage() { return std::generic_category().message(errno); }

}  // namespace kvc
