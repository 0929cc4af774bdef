// tools/run/line_splitter.hpp - turns a worker's byte stream into whole lines,
// each optionally prefixed with "[rank R]: ".
//
// The launcher is the single writer of its stdout and stderr and writes only
// whole lines, so lines of different workers never interleave mid-line. The
// splitter is pure (bytes in, bytes out) so it can be tested without processes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace cclite::run {

class line_splitter {
 public:
  /// A line longer than this is emitted in pieces (ended with '\n' when
  /// prefixing) so that a worker printing without newlines cannot grow the
  /// launcher's memory without bound.
  static constexpr std::size_t max_pending = std::size_t{1} << 20;

  line_splitter() = default;
  /// `prefix` goes before each line; empty passes bytes through unchanged.
  explicit line_splitter(std::string prefix) : prefix_(std::move(prefix)) {}

  /// Consumes `data`; returns every line it completes (with prefixes), ready to
  /// be written in one go. Bytes after the last '\n' wait for the next call.
  std::string feed(std::string_view data) {
    std::string out;
    while (!data.empty()) {
      auto nl = data.find('\n');
      if (nl == std::string_view::npos) {
        pending_.append(data.data(), data.size());
        if (pending_.size() >= max_pending) out += take_pending();
        break;
      }
      pending_.append(data.data(), nl + 1);
      emit(out, pending_);
      pending_.clear();
      data.remove_prefix(nl + 1);
    }
    return out;
  }

  /// At EOF: the unfinished last line, if any. With a prefix it gets a '\n' so
  /// the next worker's line starts on its own line; without one it is unchanged.
  std::string finish() { return pending_.empty() ? std::string() : take_pending(); }

  bool has_pending() const { return !pending_.empty(); }

 private:
  void emit(std::string& out, const std::string& line) const {
    out += prefix_;
    out += line;
  }

  std::string take_pending() {
    std::string out;
    emit(out, pending_);
    if (!prefix_.empty()) out += '\n';
    pending_.clear();
    return out;
  }

  std::string prefix_;
  std::string pending_;
};

}  // namespace cclite::run
