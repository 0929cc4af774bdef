// cclite/cuda/nvml.hpp - NVLink between two GPUs, from NVML loaded at run time.
//
//   auto n = cclite::cuda::nvml::process();            // loads libnvidia-ml.so.1 once
//   if (n) auto l = n.value()->links_between("0000:3b:00.0", "0000:5e:00.0");
//   // l.value().to_peer: active NVLinks from the first GPU that end at the second
//
// NVML ships with the driver (libnvidia-ml.so.1), not with the toolkit, and the
// toolkit here has no nvml.h. So, as NCCL does, the library is opened with
// dlopen when first needed and the handful of C entry points used are declared
// here from NVML's documented, versioned ABI (the _v2 functions and the
// nvmlPciInfo_t they fill). A machine without the driver (this development
// machine, CI) gets errc::unsupported naming the library; nothing else
// changes. CCLITE_NVML_LIBRARY names another file (the tests use a stand-in).
//
// Used by describe_peer_link() (ipc.hpp) for the log line the native engine
// writes per peer at CCLITE_DEBUG=INFO; no decision depends on it (peer access
// is cudaDeviceCanAccessPeer's). On NVSwitch systems (HGX H100 / H200) every
// link ends at a switch, so `to_peer` is 0 and `other` counts the switch links.
#pragma once

#include <dlfcn.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include <cclite/core/env.hpp>
#include <cclite/core/status.hpp>

namespace cclite::cuda {

/// A PCI address as NVML and the CUDA runtime print it ("0000:3b:00.0",
/// "00000000:3B:00.0"): domain, bus, device (the function is ignored).
struct pci_address {
  unsigned domain = 0, bus = 0, device = 0;
  bool operator==(const pci_address& o) const noexcept {
    return domain == o.domain && bus == o.bus && device == o.device;
  }
};

/// Parses "domain:bus:device.function" (hex); invalid_argument otherwise.
inline result<pci_address> parse_pci_bus_id(const std::string& s) {
  pci_address a;
  unsigned fn = 0;
  int used = -1;  // characters read: the whole string, nothing after the function digit
  if (std::sscanf(s.c_str(), "%x:%x:%x.%1x%n", &a.domain, &a.bus, &a.device, &fn, &used) != 4 ||
      used != static_cast<int>(s.size())) {
    return make_error(errc::invalid_argument, "not a PCI bus id: '%s' (expected domain:bus:device.function)",
                      s.c_str());
  }
  return a;
}

/// Active NVLinks of one GPU, by where they end.
struct nvlink_count {
  int to_peer = 0;  ///< links whose far end is the other GPU
  int other = 0;    ///< active links ending elsewhere (an NVSwitch, a third GPU)
};

class nvml {
 public:
  /// The process's NVML: loaded and initialised on first use (thread-safe),
  /// then kept for the process's life. unsupported when it cannot be.
  static result<nvml*> process() {
    static std::once_flag once;
    static std::unique_ptr<nvml> lib;
    static status failed;
    std::call_once(once, [] {
      const char* path = env::raw("NVML_LIBRARY", false);
      auto l = open(path ? path : "libnvidia-ml.so.1");
      if (l) lib = std::move(l.value());
      else failed = l.error();
    });
    if (!lib) return failed;
    return lib.get();
  }

  /// Opens and initialises the library at `path` (a file name or soname).
  /// unsupported with dlopen's / NVML's reason when that fails.
  static result<std::unique_ptr<nvml>> open(const std::string& path) {
    // Never closed: NVML may keep threads and state for the process's life.
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* why = dlerror();
      return make_error(errc::unsupported, "NVML not loaded: %s (it comes with the NVIDIA driver)",
                        why ? why : path.c_str());
    }
    std::unique_ptr<nvml> n(new nvml());
    const char* missing = nullptr;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn && !missing) missing = name;
    };
    sym(n->init_, "nvmlInit_v2");
    sym(n->error_string_, "nvmlErrorString");
    sym(n->by_bus_id_, "nvmlDeviceGetHandleByPciBusId_v2");
    sym(n->link_state_, "nvmlDeviceGetNvLinkState");
    sym(n->remote_pci_, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    if (missing) return make_error(errc::unsupported, "NVML at %s lacks %s (driver too old?)", path.c_str(), missing);
    const int r = n->init_();
    if (r != 0) return make_error(errc::unsupported, "NVML: nvmlInit_v2: %s", n->say(r).c_str());
    return result<std::unique_ptr<nvml>>(std::move(n));
  }

  /// Counts the active NVLinks of the GPU at PCI bus id `gpu` by their far
  /// end: the GPU at `peer`, or anything else. invalid_argument for a malformed
  /// id, unsupported when NVML does not know `gpu`.
  result<nvlink_count> links_between(const std::string& gpu, const std::string& peer) const {
    auto want = parse_pci_bus_id(peer);
    if (!want) return want.error();
    device dev = nullptr;
    const int r = by_bus_id_(gpu.c_str(), &dev);
    if (r != 0) return make_error(errc::unsupported, "NVML: no device at PCI %s: %s", gpu.c_str(), say(r).c_str());
    nvlink_count c;
    for (unsigned link = 0; link < max_links; ++link) {
      int active = 0;
      // Links a GPU does not have answer an error: skipped, like inactive ones.
      if (link_state_(dev, link, &active) != 0 || active != 1) continue;
      pci_info far{};
      if (remote_pci_(dev, link, &far) != 0) continue;
      const pci_address end{far.domain, far.bus, far.device};
      if (end == want.value()) ++c.to_peer;
      else ++c.other;
    }
    return c;
  }

 private:
  // From NVML's ABI (nvml.h): the types and entry points used here.
  struct device_st;
  using device = device_st*;
  struct pci_info {            // nvmlPciInfo_t (the layout of the _v2 / _v3 functions)
    char bus_id_legacy[16];
    unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
  };
  static constexpr unsigned max_links = 18;  // NVML_NVLINK_MAX_LINKS (Hopper: 18)

  nvml() = default;
  std::string say(int r) const {
    const char* s = error_string_ ? error_string_(r) : nullptr;
    return s ? std::string(s) + " (" + std::to_string(r) + ")" : "error " + std::to_string(r);
  }

  int (*init_)() = nullptr;
  const char* (*error_string_)(int) = nullptr;
  int (*by_bus_id_)(const char*, device*) = nullptr;
  int (*link_state_)(device, unsigned, int*) = nullptr;
  int (*remote_pci_)(device, unsigned, pci_info*) = nullptr;
};

/// One line for the log: "NVLink: 4 links to it", "no NVLink to it (18 to
/// NVSwitch or other GPUs)", or why NVML could not tell.
inline std::string describe_nvlink(const std::string& gpu, const std::string& peer) {
  auto n = nvml::process();
  if (!n) return n.error().message();
  auto c = n.value()->links_between(gpu, peer);
  if (!c) return c.error().message();
  const nvlink_count& l = c.value();
  if (l.to_peer > 0) return "NVLink: " + std::to_string(l.to_peer) + " links to it";
  if (l.other > 0) return "no direct NVLink to it (" + std::to_string(l.other) + " to NVSwitch or other GPUs)";
  return "no active NVLink";
}

}  // namespace cclite::cuda
