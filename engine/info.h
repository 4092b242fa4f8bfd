// engine/info.h — facts about the I/O layer for `strata info` (apps reach io/ only through
// the engine).
#pragma once

#include <nlohmann/json.hpp>

namespace strata {

nlohmann::json io_info();  // {"io_uring_built", "io_uring_usable", ...}

}  // namespace strata
