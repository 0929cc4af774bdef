// tools/run/cpu_bind.hpp - --bind-to core|numa|none: each local worker gets its
// own share of the CPUs this launcher may use, as `mpirun --bind-to core|numa`
// and `srun --cpu-bind=cores` do. torchrun binds nothing, and neither does the
// default (none): a program may bind its threads itself.
//
// Why bind: workers started together start on the launcher's CPU, and the
// scheduler spreads them only after a few milliseconds; two ranks of a 2-CPU
// machine that share one CPU pay ~3x per call until then (docs/performance.md,
// Session 42: a 64 KiB tcp allreduce 79-83 us on one CPU, 28-36 us apart).
// Bound, each worker's threads stay on its CPUs, and a NUMA node's memory stays
// near them.
//
// Units: "core" = the CPUs of one physical core (hyperthreads: one
// physical_package_id and core_id in sysfs), "numa" = one NUMA node's CPUs,
// each only where this process may run (sched_getaffinity: a container's,
// cgroup's or Slurm task's share). Units are ordered by node, package, core;
// worker i of n gets units [i*U/n, (i+1)*U/n): consecutive, as even as
// possible. More workers than units: worker i gets unit i % U (shared).
#pragma once

#include <dirent.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace cclite::run {

/// Where one CPU sits (ids as sysfs numbers them).
struct cpu_place {
  int cpu = 0;
  int node = 0;
  int package = 0;
  int core = 0;  ///< physical core id, unique within its package
};

/// Parses a sysfs CPU list ("0-3,8,10-11"; "" is empty); false on anything else.
inline bool parse_cpu_list(const std::string& text, std::vector<int>& out) {
  out.clear();
  std::string s = text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t comma = std::min(s.find(',', i), s.size());
    const std::string item = s.substr(i, comma - i);
    int lo = -1, hi = -1, used = 0;
    if (std::sscanf(item.c_str(), "%d-%d%n", &lo, &hi, &used) == 2 && used == static_cast<int>(item.size())) {
    } else if (std::sscanf(item.c_str(), "%d%n", &lo, &used) == 1 && used == static_cast<int>(item.size())) {
      hi = lo;
    } else {
      return false;
    }
    if (lo < 0 || hi < lo || hi - lo > (1 << 20)) return false;
    for (int c = lo; c <= hi; ++c) out.push_back(c);
    i = comma + 1;
  }
  return true;
}

/// "0-3,8" for a sorted list of CPU ids.
inline std::string cpu_list_string(const std::vector<int>& cpus) {
  std::string s;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(cpus[i]);
    if (j > i) s += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return s;
}

namespace detail {
inline int read_int_file(const std::string& path, int fallback) {
  std::ifstream in(path);
  int v = fallback;
  if (!(in >> v)) return fallback;
  return v;
}
}  // namespace detail

/// The CPUs this process may run on, placed by the sysfs tree under `sys`
/// (/sys/devices/system; tests pass a tree of their own). A CPU whose topology
/// files are missing counts as a core of its own on node 0; `allowed` empty
/// means "ask sched_getaffinity".
inline std::vector<cpu_place> read_cpu_places(const std::string& sys = "/sys/devices/system",
                                              std::vector<int> allowed = {}) {
  if (allowed.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) != 0) return {};
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) allowed.push_back(c);
  }
  std::map<int, int> node_of;
  if (DIR* d = ::opendir((sys + "/node").c_str())) {
    while (const dirent* e = ::readdir(d)) {
      int node = -1, used = 0;
      const std::string name = e->d_name;
      if (std::sscanf(name.c_str(), "node%d%n", &node, &used) != 1 || used != static_cast<int>(name.size()))
        continue;
      std::ifstream in(sys + "/node/" + name + "/cpulist");
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::vector<int> cpus;
      if (parse_cpu_list(text, cpus))
        for (int c : cpus) node_of[c] = node;
    }
    ::closedir(d);
  }
  std::vector<cpu_place> out;
  for (int c : allowed) {
    const std::string topo = sys + "/cpu/cpu" + std::to_string(c) + "/topology/";
    cpu_place p;
    p.cpu = c;
    p.node = node_of.count(c) ? node_of[c] : 0;
    p.package = detail::read_int_file(topo + "physical_package_id", 0);
    p.core = detail::read_int_file(topo + "core_id", -1 - c);  // missing: a core of its own
    out.push_back(p);
  }
  return out;
}

/// The CPU lists of `nproc` local workers for --bind-to `how` ("core" or
/// "numa"; anything else, or no CPUs: empty, i.e. bind nothing). `shared` is
/// set when there are more workers than units, so that some share one.
inline std::vector<std::vector<int>> cpu_sets_for(const std::vector<cpu_place>& cpus, const std::string& how,
                                                  int nproc, bool* shared = nullptr) {
  if (shared) *shared = false;
  if ((how != "core" && how != "numa") || cpus.empty() || nproc <= 0) return {};
  // Units keyed so that map order is the order they are handed out in.
  std::map<std::tuple<int, int, int>, std::vector<int>> units;
  for (const cpu_place& p : cpus) {
    const auto key = how == "numa" ? std::make_tuple(p.node, 0, 0) : std::make_tuple(p.node, p.package, p.core);
    units[key].push_back(p.cpu);
  }
  std::vector<std::vector<int>> list;
  for (auto& [key, v] : units) {
    std::sort(v.begin(), v.end());
    list.push_back(v);
  }
  const long u = static_cast<long>(list.size());
  std::vector<std::vector<int>> sets(static_cast<std::size_t>(nproc));
  for (long i = 0; i < nproc; ++i) {
    auto& s = sets[static_cast<std::size_t>(i)];
    if (nproc > u) {
      s = list[static_cast<std::size_t>(i % u)];
      continue;
    }
    for (long k = i * u / nproc; k < (i + 1) * u / nproc; ++k)
      s.insert(s.end(), list[static_cast<std::size_t>(k)].begin(), list[static_cast<std::size_t>(k)].end());
    std::sort(s.begin(), s.end());
  }
  if (shared) *shared = nproc > u;
  return sets;
}

}  // namespace cclite::run
