// core/size.h — byte sizes as users write them ("512M", "2G", "1.5G", "4096") and as strata
// prints them, and checked arithmetic for sizes computed from untrusted numbers (file headers,
// config keys). Units are binary (K = 1024). Parsing rejects negative, empty and overflowing
// values; checked_mul / checked_add / checked_cast return the exact result or throw an Error,
// never wrap around or overflow a signed type.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace strata {

inline constexpr uint64_t KiB = 1024ull;
inline constexpr uint64_t MiB = 1024ull * KiB;
inline constexpr uint64_t GiB = 1024ull * MiB;
inline constexpr uint64_t TiB = 1024ull * GiB;

// ⌈n / d⌉ and n rounded up to a multiple of d, for d > 0. div_ceil cannot overflow; round_up
// wraps when the rounded value does not fit in T (sizes from untrusted input: checked_mul).
template <std::unsigned_integral T>
constexpr T div_ceil(T n, std::type_identity_t<T> d) {
  return n / d + (n % d != 0);
}
template <std::unsigned_integral T>
constexpr T round_up(T n, std::type_identity_t<T> d) {
  return div_ceil(n, d) * d;
}

// "512M" → 536870912. Accepts an optional B/iB after the suffix ("2GiB", "64KB"), any case.
// `what` names the setting in the error message.
uint64_t parse_bytes(std::string_view text, std::string_view what = "size");
// 536870912 → "512M"; 1610612736 → "1.5G"; values below 1K print as plain bytes.
std::string format_bytes(uint64_t bytes);

namespace detail {
[[noreturn]] void size_overflow(std::string_view what, std::string_view op, std::string a,
                                std::string b, bool is_signed, int bits);
// `what` of the checked helpers: text, or a callable returning it (built only on failure).
template <class What>
std::string what_text(const What& what) {
  if constexpr (std::is_invocable_v<const What&>) return std::string(what());
  else return std::string(std::string_view(what));
}
}  // namespace detail

// a × b in T, or an Error "[core::size] what: a x b does not fit in int64" when the exact product
// does not. `what` names the quantity ("activation bytes"), or is a callable that returns the
// name, so a hot caller builds it only on failure: [&] { return str("tensor '", name, "'"); }.
// Both operands have the same type: convert first, e.g. checked_mul<uint64_t>(rows, cols, ...).
template <std::integral T, class What>
T checked_mul(T a, T b, const What& what) {
  T r;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]]
    detail::size_overflow(detail::what_text(what), " x ", std::to_string(a), std::to_string(b),
                          std::is_signed_v<T>, int(sizeof(T) * 8));
  return r;
}

// a + b in T, or an Error as for checked_mul.
template <std::integral T, class What>
T checked_add(T a, T b, const What& what) {
  T r;
  if (__builtin_add_overflow(a, b, &r)) [[unlikely]]
    detail::size_overflow(detail::what_text(what), " + ", std::to_string(a), std::to_string(b),
                          std::is_signed_v<T>, int(sizeof(T) * 8));
  return r;
}

// v as To (e.g. a 64-bit element count narrowed to a kernel's int dimension), or an Error when
// To cannot hold it.
template <std::integral To, std::integral From, class What>
To checked_cast(From v, const What& what) {
  if (!std::in_range<To>(v)) [[unlikely]]
    detail::size_overflow(detail::what_text(what), "", std::to_string(v), "",
                          std::is_signed_v<To>, int(sizeof(To) * 8));
  return static_cast<To>(v);
}

}  // namespace strata
