// tests/gpu/fake_nvml.cpp - a stand-in libnvidia-ml for cuda_test (no driver here).
//
// Exports the NVML entry points cclite/cuda/nvml.hpp loads, with NVML's C ABI,
// describing two GPUs:
//   0000:3b:00.0  links 0-3 active to 0000:5e:00.0, links 4-5 active to an
//                 NVSwitch at 0000:c1:00.0, link 6 inactive, links 7+ absent
//   0000:5e:00.0  links 0-3 active to 0000:3b:00.0
// Any other bus id is NVML_ERROR_NOT_FOUND. Remote PCI info is written in the
// nvmlPciInfo_t layout, bus ids in NVML's own 8-digit-domain upper-case form.
#include <cstdio>
#include <cstring>

namespace {
enum : int { ok = 0, uninitialized = 1, invalid_argument = 2, not_found = 6 };
struct device_st {
  unsigned bus;
};
device_st gpu_a{0x3b}, gpu_b{0x5e};
bool initialised = false;

struct pci_info {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};

// The far end of `link` of `d`, 0 when the link is inactive; -1 when absent.
int far_bus(const device_st* d, unsigned link) {
  if (link > 6) return -1;
  if (d == &gpu_a) return link < 4 ? 0x5e : link < 6 ? 0xc1 : 0;
  return link < 4 ? 0x3b : 0;
}
}  // namespace

extern "C" {
int nvmlInit_v2() {
  initialised = true;
  return ok;
}
const char* nvmlErrorString(int r) {
  switch (r) {
    case ok: return "Success";
    case uninitialized: return "Uninitialized";
    case invalid_argument: return "Invalid Argument";
    case not_found: return "Not Found";
  }
  return "Unknown Error";
}
int nvmlDeviceGetHandleByPciBusId_v2(const char* id, device_st** d) {
  if (!initialised) return uninitialized;
  unsigned dom = 0, bus = 0, dev = 0, fn = 0;
  if (!id || !d || std::sscanf(id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) return invalid_argument;
  if (dom != 0 || dev != 0) return not_found;
  if (bus == gpu_a.bus) *d = &gpu_a;
  else if (bus == gpu_b.bus) *d = &gpu_b;
  else return not_found;
  return ok;
}
int nvmlDeviceGetNvLinkState(device_st* d, unsigned link, int* active) {
  const int b = far_bus(d, link);
  if (b < 0) return invalid_argument;
  *active = b > 0 ? 1 : 0;
  return ok;
}
int nvmlDeviceGetNvLinkRemotePciInfo_v2(device_st* d, unsigned link, pci_info* p) {
  const int b = far_bus(d, link);
  if (b <= 0) return invalid_argument;
  std::memset(p, 0, sizeof *p);
  p->domain = 0;
  p->bus = static_cast<unsigned>(b);
  p->device = 0;
  std::snprintf(p->bus_id, sizeof p->bus_id, "00000000:%02X:00.0", p->bus);
  std::snprintf(p->bus_id_legacy, sizeof p->bus_id_legacy, "0000:%02X:00.0", p->bus);
  return ok;
}
}
