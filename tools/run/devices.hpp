// tools/run/devices.hpp - `--nproc-per-node gpu|cpu|auto` (torchrun's
// spellings): one worker per GPU this process may use, per CPU, or per GPU
// when there are GPUs and per CPU otherwise.
//
// GPUs are counted without the CUDA runtime (cclite-run links none): the
// NVIDIA driver lists each GPU under /proc/driver/nvidia/gpus/, and
// CUDA_VISIBLE_DEVICES narrows that as the runtime reads it (entries up to the
// first invalid one; an empty value hides every GPU). CPUs are those this
// process may run on (sched_getaffinity: a container's or a Slurm task's
// share), where torchrun counts every CPU of the machine.
#pragma once

#include <dirent.h>
#include <sched.h>

#include <cctype>
#include <cstring>
#include <string>

#include "options.hpp"

namespace cclite::run {

/// GPUs the NVIDIA driver lists in `driver_dir`, narrowed by `visible`
/// (CUDA_VISIBLE_DEVICES; null when unset).
inline int visible_gpus(const char* visible, const std::string& driver_dir = "/proc/driver/nvidia/gpus") {
  int present = 0;
  if (DIR* d = ::opendir(driver_dir.c_str())) {
    while (const dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++present;
    ::closedir(d);
  }
  if (!visible) return present;
  int listed = 0;
  const std::string v = visible;
  for (std::size_t at = 0; at <= v.size();) {
    std::size_t end = v.find(',', at);
    if (end == std::string::npos) end = v.size();
    std::string item = v.substr(at, end - at);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.pop_back();
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.erase(0, 1);
    bool ok = !item.empty();
    if (ok && (item.rfind("GPU-", 0) == 0 || item.rfind("MIG-", 0) == 0)) {
      // a UUID: cannot be checked without the driver's library; taken as one GPU
    } else {
      int index = 0;
      ok = ok && detail::parse_int(item, 0, 1 << 20, index) && index < present;
    }
    if (!ok) break;  // the runtime stops at the first invalid entry
    ++listed;
    at = end + 1;
  }
  return listed < present ? listed : present;
}

/// CPUs this process may run on.
inline int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  const int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}

/// Resolves `o.nproc_spec` ("gpu", "cpu", "auto"; "" when --nproc-per-node
/// was a number) into o.nproc_per_node. Returns a usage error, or "".
template <class Get>
std::string resolve_nproc(options& o, Get&& get, const std::string& driver_dir = "/proc/driver/nvidia/gpus") {
  if (o.nproc_spec.empty()) return {};
  const char* visible = get("CUDA_VISIBLE_DEVICES");
  const int gpus = o.nproc_spec == "cpu" ? 0 : visible_gpus(visible, driver_dir);
  if (o.nproc_spec == "gpu" && gpus == 0)
    return std::string("--nproc-per-node gpu: no GPU here (") + driver_dir + " lists none" +
           (visible ? std::string(" or CUDA_VISIBLE_DEVICES='") + visible + "' hides them" : std::string()) +
           "); give a number, or cpu";
  o.nproc_per_node = gpus > 0 ? gpus : usable_cpus();
  return {};
}

}  // namespace cclite::run
