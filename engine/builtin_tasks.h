// engine/builtin_tasks.h — the synthetic byte streams behind "builtin:NAME" (not public API).
//
// Each task is generated from a fixed internal seed, so it is the same bytes on every machine
// and in every run, whatever train.seed is. Every task is exactly kBuiltinTaskBytes long.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace strata {

inline constexpr uint64_t kBuiltinTaskBytes = 1ull << 20;

// The bytes of task `name` ("words", "count", "random"); an Error listing the tasks otherwise.
std::vector<uint8_t> make_builtin_task(std::string_view name);

}  // namespace strata
