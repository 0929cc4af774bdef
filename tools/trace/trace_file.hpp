// tools/trace/trace_file.hpp - reading the flight recorder's files
// (include/cclite/collective/flight_recorder.hpp has the format): one file per
// process, every communicator of that process in it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <istream>
#include <map>
#include <string>
#include <vector>

namespace cclite_trace {

/// One recorded call, as written.
struct call {
  std::uint64_t seq = 0, coll = 0, count = 0, count2 = 0;
  std::int64_t start_us = 0, end_us = 0;
  std::int64_t queued_us = 0;  ///< state "queued": when it was issued (it has no start yet)
  int root = 0, peer2 = 0;
  std::string kind, dtype, op, state, code;
  std::string algo;  ///< the algorithm it ran (one token); empty: not recorded (queued, older files)
};

/// One communicator's section of a process's file.
struct comm_section {
  std::string id, name;
  int rank = -1, size = 0;
  std::uint64_t calls = 0;  ///< recorded since creation (`calls` may exceed what was kept)
  std::vector<call> kept;   ///< oldest first; then the calls queued and not started (state "queued")
};

/// One process's file.
struct process_dump {
  std::string path, host, reason;
  long pid = 0;
  std::int64_t dumped_us = 0;
  std::vector<comm_section> comms;
};

namespace detail {

// "key=value key=value ..." after the record's first word; `rest_key` (if
// set) takes the rest of the line, spaces included.
inline std::map<std::string, std::string> fields(const std::string& line, const char* rest_key = nullptr) {
  std::map<std::string, std::string> f;
  std::size_t i = line.find(' ');
  while (i != std::string::npos && i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    const std::size_t eq = line.find('=', i);
    if (eq == std::string::npos) break;
    const std::string key = line.substr(i, eq - i);
    if (rest_key && key == rest_key) {
      f[key] = line.substr(eq + 1);
      break;
    }
    const std::size_t end = line.find(' ', eq);
    f[key] = line.substr(eq + 1, end == std::string::npos ? std::string::npos : end - eq - 1);
    i = end;
  }
  return f;
}

inline bool to_i64(const std::map<std::string, std::string>& f, const char* key, std::int64_t& out) {
  auto it = f.find(key);
  if (it == f.end() || it->second.empty()) return false;
  char* end = nullptr;
  out = std::strtoll(it->second.c_str(), &end, 10);
  return *end == '\0';
}

}  // namespace detail

/// Parses a file's text from `in` (`path` names it in errors); false with
/// `err` set when it is not a flight recorder file or a record is malformed
/// (the line number says where).
inline bool parse_dump(std::istream& in, const std::string& path, process_dump& out, std::string& err) {
  out = process_dump{};
  out.path = path;
  std::string line;
  int no = 0;
  auto bad = [&](const char* what) {
    err = path + ":" + std::to_string(no) + ": " + what;
    return false;
  };
  while (std::getline(in, line)) {
    ++no;
    if (no == 1) {
      if (line != "cclite-trace 1") return bad("not a cclite flight recorder file (version 1)");
      continue;
    }
    const std::string word = line.substr(0, line.find(' '));
    std::int64_t v = 0;
    if (word == "process") {
      auto f = detail::fields(line, "reason");
      out.host = f["host"];
      if (!detail::to_i64(f, "pid", v)) return bad("process record without pid");
      out.pid = static_cast<long>(v);
      if (detail::to_i64(f, "dumped_us", v)) out.dumped_us = v;
      out.reason = f["reason"];
    } else if (word == "comm") {
      auto f = detail::fields(line);
      comm_section c;
      c.id = f["id"];
      c.name = f["name"];
      if (!detail::to_i64(f, "rank", v)) return bad("comm record without rank");
      c.rank = static_cast<int>(v);
      // At most 2^20 ranks: the report lists ranks without a file one by one.
      if (!detail::to_i64(f, "size", v) || v < 1 || v > (1 << 20) || c.rank < 0 || c.rank >= v) {
        return bad("comm record: bad rank or size");
      }
      c.size = static_cast<int>(v);
      if (detail::to_i64(f, "calls", v)) c.calls = static_cast<std::uint64_t>(v);
      out.comms.push_back(std::move(c));
    } else if (word == "call") {
      if (out.comms.empty()) return bad("call record before any comm record");
      auto f = detail::fields(line);
      call c;
      std::int64_t seq = 0, coll = 0, count = 0, count2 = 0, root = 0, peer2 = 0, s = 0, e = 0;
      if (!detail::to_i64(f, "seq", seq) || !detail::to_i64(f, "coll", coll) || !detail::to_i64(f, "count", count) ||
          !detail::to_i64(f, "start_us", s) || !detail::to_i64(f, "end_us", e)) {
        return bad("call record: missing seq, coll, count, start_us or end_us");
      }
      detail::to_i64(f, "count2", count2);
      detail::to_i64(f, "root", root);
      detail::to_i64(f, "peer2", peer2);
      detail::to_i64(f, "queued_us", c.queued_us);
      c.seq = static_cast<std::uint64_t>(seq);
      c.coll = static_cast<std::uint64_t>(coll);
      c.count = static_cast<std::uint64_t>(count);
      c.count2 = static_cast<std::uint64_t>(count2);
      c.root = static_cast<int>(root);
      c.peer2 = static_cast<int>(peer2);
      c.start_us = s;
      c.end_us = e;
      c.kind = f["kind"];
      c.dtype = f["dtype"];
      c.op = f["op"];
      c.state = f["state"];
      c.code = f["code"];
      c.algo = f["algo"];
      out.comms.back().kept.push_back(std::move(c));
    } else if (!line.empty()) {
      return bad("unknown record");
    }
  }
  if (no == 0) {
    err = path + ": empty file";
    return false;
  }
  return true;
}

/// Reads the file `path` (parse_dump).
inline bool read_dump(const std::string& path, process_dump& out, std::string& err) {
  std::ifstream in(path);
  if (!in) {
    err = path + ": cannot open";
    return false;
  }
  return parse_dump(in, path, out, err);
}

}  // namespace cclite_trace
