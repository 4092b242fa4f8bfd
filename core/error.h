// core/error.h — the one exception type of strata, and the checks that throw it.
//
// Messages read "[component::op] what failed: values", followed by "hint: ..." lines where the
// user can fix the problem. Library code throws; only apps/ turns an Error into an exit code.
// The checks stay on in Release builds. Per-foreign-API macros (CUDA, NCCL, MPI, io_uring) are
// defined here textually and expand only in the files that include the foreign header.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata {

class Error : public std::runtime_error {
 public:
  // where: "component::op"; what: the failure with its values; hints: one line each.
  Error(std::string where, std::string what, std::vector<std::string> hints = {});

  const std::string& where() const noexcept { return where_; }
  const std::string& what_failed() const noexcept { return what_; }
  const std::vector<std::string>& hints() const noexcept { return hints_; }

 private:
  std::string where_;
  std::string what_;
  std::vector<std::string> hints_;
};

// str(a, b, c): concatenates anything that has operator<<.
template <class... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Throws Error(where, what, {hint}) — the usual way to report bad input.
[[noreturn]] void fail(std::string where, std::string what, std::string hint = {});

namespace detail {
[[noreturn]] void check_failed(const char* where, const char* cond, const char* file, int line,
                               const std::string& msg);
[[noreturn]] void api_failed(const char* api, const char* stmt, const char* file, int line,
                             long code, const char* text);
}  // namespace detail

}  // namespace strata

// STRATA_CHECK(cond, "component::op", message parts...): an invariant; the message names the
// condition and its place in the source.
#define STRATA_CHECK(cond, where, ...)                                                        \
  do {                                                                                        \
    if (!(cond)) [[unlikely]]                                                                 \
      ::strata::detail::check_failed(where, #cond, __FILE__, __LINE__,                        \
                                     ::strata::str("" __VA_OPT__(, ) __VA_ARGS__));          \
  } while (0)

// io_uring / liburing and raw syscalls returning -errno.
#define STRATA_URING_CHECK(expr)                                                              \
  do {                                                                                        \
    long strata_rc_ = static_cast<long>(expr);                                                \
    if (strata_rc_ < 0) [[unlikely]]                                                          \
      ::strata::detail::api_failed("io_uring", #expr, __FILE__, __LINE__, strata_rc_,         \
                                   ::strata::detail::errno_text(static_cast<int>(-strata_rc_))); \
  } while (0)

#define STRATA_CUDA_CHECK(expr)                                                               \
  do {                                                                                        \
    cudaError_t strata_rc_ = (expr);                                                          \
    if (strata_rc_ != cudaSuccess) [[unlikely]]                                               \
      ::strata::detail::api_failed("cuda", #expr, __FILE__, __LINE__,                         \
                                   static_cast<long>(strata_rc_),                             \
                                   cudaGetErrorString(strata_rc_));                           \
  } while (0)

#define STRATA_CUBLAS_CHECK(expr)                                                             \
  do {                                                                                        \
    cublasStatus_t strata_rc_ = (expr);                                                       \
    if (strata_rc_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                     \
      ::strata::detail::api_failed("cublas", #expr, __FILE__, __LINE__,                       \
                                   static_cast<long>(strata_rc_),                             \
                                   cublasGetStatusString(strata_rc_));                        \
  } while (0)

#define STRATA_NCCL_CHECK(expr)                                                               \
  do {                                                                                        \
    ncclResult_t strata_rc_ = (expr);                                                         \
    if (strata_rc_ != ncclSuccess) [[unlikely]]                                               \
      ::strata::detail::api_failed("nccl", #expr, __FILE__, __LINE__,                         \
                                   static_cast<long>(strata_rc_),                             \
                                   ncclGetErrorString(strata_rc_));                           \
  } while (0)

#define STRATA_MPI_CHECK(expr)                                                                \
  do {                                                                                        \
    int strata_rc_ = (expr);                                                                  \
    if (strata_rc_ != MPI_SUCCESS) [[unlikely]] {                                             \
      char strata_msg_[MPI_MAX_ERROR_STRING] = {0};                                           \
      int strata_len_ = 0;                                                                    \
      MPI_Error_string(strata_rc_, strata_msg_, &strata_len_);                                \
      ::strata::detail::api_failed("mpi", #expr, __FILE__, __LINE__,                          \
                                   static_cast<long>(strata_rc_), strata_msg_);               \
    }                                                                                         \
  } while (0)

namespace strata::detail {
const char* errno_text(int err) noexcept;  // strerror, thread-safe
}
