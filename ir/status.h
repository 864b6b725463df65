// Status and Result<T>: how anything a user or a plugin can get wrong is reported (STYLE.md #8).
// Compiler bugs are not reported this way: they are TPC_ASSERTs (see assert.h).
#pragma once

#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <variant>

namespace tpc {

// Concatenates anything that streams into one string: cat("tp=", 4, " does not divide ", 12).
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// A user-facing error: one line that names the thing that is wrong and, where possible, the fix.
struct Error {
  std::string message;
};

template <class... Args>
Error makeError(const Args&... args) {
  return Error{cat(args...)};
}

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error e) : msg_(std::move(e.message)) {}
  static Status success() { return Status(); }
  bool ok() const { return !msg_.has_value(); }
  explicit operator bool() const { return ok(); }
  const std::string& error() const { return *msg_; }

 private:
  std::optional<std::string> msg_;
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Error e) : v_(std::move(e)) {}
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() { return value(); }
  T* operator->() { return &value(); }
  const std::string& error() const { return std::get<1>(v_).message; }
  Status status() const { return ok() ? Status() : Status(std::get<1>(v_)); }

 private:
  std::variant<T, Error> v_;
};

}  // namespace tpc

// Propagates a failed Status/Result out of the enclosing function (which returns Status or Result).
#define TPC_TRY(expr)                                     \
  do {                                                    \
    auto&& _tpc_try = (expr);                             \
    if (!_tpc_try.ok()) return ::tpc::Error{_tpc_try.error()}; \
  } while (0)

#define TPC_CONCAT_INNER(a, b) a##b
#define TPC_CONCAT(a, b) TPC_CONCAT_INNER(a, b)
// TPC_ASSIGN(auto x, computeResult()): binds the value or propagates the error.
#define TPC_ASSIGN(decl, expr) TPC_ASSIGN_IMPL(TPC_CONCAT(_tpc_res, __LINE__), decl, expr)
#define TPC_ASSIGN_IMPL(tmp, decl, expr)                \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) return ::tpc::Error{tmp.error()};      \
  decl = std::move(tmp).value()
