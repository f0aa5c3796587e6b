// Result<T> and Status: the channel for expected failures (bad files, bad project fields, bad
// flags). Programmer errors use TD_ASSERT instead, which reports file and line.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace td {

struct Error {
    std::string message;
};

// Make an error value: `return td::err("layer 'dense': units must be > 0");`
inline Error err(std::string message) {
    return Error{std::move(message)};
}

template <typename T>
class [[nodiscard]] Result {
  public:
    Result(T value) : v_(std::move(value)) {}
    Result(Error e) : v_(std::move(e)) {}

    bool ok() const { return v_.index() == 0; }
    explicit operator bool() const { return ok(); }
    const std::string& error() const { return std::get<1>(v_).message; }

    T& value() & { return std::get<0>(v_); }
    const T& value() const& { return std::get<0>(v_); }
    T&& value() && { return std::get<0>(std::move(v_)); }
    T* operator->() { return &std::get<0>(v_); }
    const T* operator->() const { return &std::get<0>(v_); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }
    Error takeError() && { return std::get<1>(std::move(v_)); }

  private:
    std::variant<T, Error> v_;
};

// Status: a Result with no value.
class [[nodiscard]] Status {
  public:
    Status() = default;
    Status(Error e) : e_(std::move(e)) {}
    static Status success() { return {}; }
    bool ok() const { return !e_.has_value(); }
    explicit operator bool() const { return ok(); }
    const std::string& error() const { return e_->message; }
    Error takeError() && { return std::move(*e_); }

  private:
    std::optional<Error> e_;
};

// The outcome of a Result without its value.
template <typename T>
Status statusOf(const Result<T>& r) {
    if (r.ok()) return Status::success();
    return Error{r.error()};
}

[[noreturn]] inline void assertFailed(const char* expr, const char* file, int line,
                                      const char* msg) {
    std::fprintf(stderr, "TrainDeck internal error: %s:%d: assertion '%s' failed%s%s\n", file, line,
                 expr, msg ? ": " : "", msg ? msg : "");
    std::abort();
}

}  // namespace td

// Programmer errors only (never bad user input).
#define TD_ASSERT(cond) ((cond) ? (void)0 : ::td::assertFailed(#cond, __FILE__, __LINE__, nullptr))
#define TD_ASSERT_MSG(cond, msg) \
    ((cond) ? (void)0 : ::td::assertFailed(#cond, __FILE__, __LINE__, (msg)))

#define TD_CONCAT_INNER(a, b) a##b
#define TD_CONCAT(a, b) TD_CONCAT_INNER(a, b)

// Propagate a failed Status/Result from the enclosing function.
#define TD_RETURN_IF_ERROR(expr)                                        \
    do {                                                                \
        auto&& td_status_ = (expr);                                     \
        if (!td_status_.ok()) return std::move(td_status_).takeError(); \
    } while (0)

// `TD_ASSIGN_OR_RETURN(auto x, makeX());`
#define TD_ASSIGN_OR_RETURN(lhs, expr) \
    TD_ASSIGN_OR_RETURN_IMPL(TD_CONCAT(td_res_, __LINE__), lhs, expr)
#define TD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr)      \
    auto tmp = (expr);                                \
    if (!tmp.ok()) return std::move(tmp).takeError(); \
    lhs = std::move(tmp).value()
