// Errors carry the process exit code the CLI must use (README.md, exit codes):
// 2 = bad input or usage, 1 = the run failed or an integrity check failed.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace actcap {

// Messages name what failed in the library's own words; `settings` names the options the user can
// change to fix it (the fields of the options structs: "capture_budget", "max_length", ...). A
// front end adds its own spelling of them: the CLI appends its flags (cli/main.cpp), so no library
// message speaks CLI.
class Error : public std::runtime_error {
 public:
  Error(int exit_code, const std::string& what, std::vector<std::string> settings = {})
      : std::runtime_error(what), exit_code_(exit_code), settings_(std::move(settings)) {}
  int exit_code() const { return exit_code_; }
  const std::vector<std::string>& settings() const { return settings_; }

 private:
  int exit_code_;
  std::vector<std::string> settings_;
};

// Bad input or usage: malformed files, unknown names, impossible requests. Exit code 2.
class InputError : public Error {
 public:
  explicit InputError(const std::string& what, std::vector<std::string> settings = {})
      : Error(2, what, std::move(settings)) {}
};

// The run itself failed (budget exceeded, hook threw, integrity check failed). Exit code 1.
class RunError : public Error {
 public:
  explicit RunError(const std::string& what, std::vector<std::string> settings = {})
      : Error(1, what, std::move(settings)) {}
};

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  append(os, rest...);
}
}  // namespace detail

// Builds a message from pieces: concat("tensor ", name, " has shape ", shape).
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  detail::append(os, args...);
  return os.str();
}

}  // namespace actcap
