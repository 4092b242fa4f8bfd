// core/size.h — byte sizes as users write them ("512M", "2G", "1.5G", "4096") and as strata
// prints them. Units are binary (K = 1024). Parsing rejects negative, empty and overflowing values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace strata {

inline constexpr uint64_t KiB = 1024ull;
inline constexpr uint64_t MiB = 1024ull * KiB;
inline constexpr uint64_t GiB = 1024ull * MiB;
inline constexpr uint64_t TiB = 1024ull * GiB;

// "512M" → 536870912. Accepts an optional B/iB after the suffix ("2GiB", "64KB"), any case.
// `what` names the setting in the error message.
uint64_t parse_bytes(std::string_view text, std::string_view what = "size");
// 536870912 → "512M"; 1610612736 → "1.5G"; values below 1K print as plain bytes.
std::string format_bytes(uint64_t bytes);

}  // namespace strata
