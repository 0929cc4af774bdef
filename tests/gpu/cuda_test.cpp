// The CUDA layer on any machine: without a GPU (CI, the development VM) every
// CUDA entry point must answer with a clear 'no CUDA device' status, never a
// crash, and the CPU collectives must keep working in the same binary. With a
// GPU the same cases check the positive answers. Built whenever the CUDA Toolkit
// is found (tests/gpu/gpu.cmake); device-heavy checks live in tests/gpu/run.sh.
//
// CUDA calls are made in forked children only: the CUDA runtime does not
// survive fork(), so the parent stays CUDA-free for the next test case.
#include <cclite/cuda/device_buffers.hpp>
#include <cclite/cuda/device_communicator.hpp>
#include <cclite/cuda/device_data_parallel.hpp>
#include <cclite/cuda/gpu_backend.hpp>
#include <cclite/cuda/ipc.hpp>
#include <cclite/cuda/ipc_plan.hpp>
#include <cclite/cuda/nvml.hpp>
#include <cclite/cuda/runtime.hpp>
#include <cclite/cuda/staged_plan.hpp>
#include <cclite/cuda/staging.hpp>

#include <cclite/cclite.hpp>

#if defined(CCLITE_HAS_NCCL)
#include <cclite/nccl/backend.hpp>
#endif

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "reference.hpp"
#include "support/comm.hpp"
#include "support/mp.hpp"

using namespace cclite;

namespace {

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// Runs `fn` in one forked child (see the file comment) and returns whether it passed.
bool in_child(const std::function<int()>& fn) {
  auto r = test::run_ranks(1, [&](int, int) { return fn(); }, std::chrono::seconds(120));
  return r.all_ok();
}

}  // namespace

TEST_CASE("device_count is a count or a clear no-device status") {
  CHECK(in_child([] {
    auto n = cuda::device_count();
    if (n) {
      MP_CHECK(n.value() >= 1);
      MP_CHECK(cuda::available());
      std::printf("cuda_test: %d CUDA device(s)\n", n.value());
    } else {
      std::printf("cuda_test: %s\n", n.error().to_string().c_str());
      MP_CHECK(n.error().code() == errc::unsupported);
      MP_CHECK(contains(n.error().message(), "no CUDA device"));
      MP_CHECK(contains(n.error().message(), "nvidia-smi"));  // the hint
      MP_CHECK(!cuda::available());
      // Asking again gives the same answer: nothing sticky, nothing crashed.
      auto again = cuda::device_count();
      MP_CHECK(!again.ok() && again.error().code() == errc::unsupported);
      MP_CHECK(cuda::set_device(0).code() == errc::unsupported);
      auto buf = cuda::device_buffer::allocate(1024);
      MP_CHECK(!buf.ok() && buf.error().code() == errc::unsupported);
      auto st = cuda::stream::create();
      MP_CHECK(!st.ok() && st.error().code() == errc::unsupported);
    }
    return 0;
  }));
}

TEST_CASE("host memory is never taken for device memory") {
  CHECK(in_child([] {
    std::vector<float> host(1024, 1.0f);
    int on_stack = 0;
    MP_CHECK(cuda::query_pointer(host.data()).kind == cuda::memory_kind::host);
    MP_CHECK(!cuda::is_device_pointer(host.data()));
    MP_CHECK(!cuda::is_device_pointer(&on_stack));
    MP_CHECK(!cuda::is_device_pointer(nullptr));
    if (cuda::available()) {
      auto buf = cuda::device_buffer::allocate(4096);
      MP_REQUIRE_OK(buf);
      const auto info = cuda::query_pointer(buf.value().data());
      MP_CHECK(info.kind == cuda::memory_kind::device);
      MP_CHECK(info.device >= 0);
      MP_CHECK(cuda::is_device_pointer(buf.value().as<char>() + 100));
    }
    return 0;
  }));
}

TEST_CASE("CUDA IPC handles fail cleanly") {
  CHECK(in_child([] {
    // Wrong-sized handles are refused before any CUDA call.
    auto m = cuda::ipc_mapping::open("not a handle");
    MP_CHECK(!m.ok() && m.error().code() == errc::protocol_error);
    auto e = cuda::ipc_event::open(std::string(3, 'x'));
    MP_CHECK(!e.ok() && e.error().code() == errc::protocol_error);
    std::vector<float> host(64);
    auto h = cuda::export_memory(host.data());
    MP_REQUIRE(!h.ok());
    if (cuda::available()) {
      MP_CHECK(h.error().code() == errc::invalid_argument);  // host memory cannot be exported
    } else {
      MP_CHECK(h.error().code() == errc::unsupported);
      MP_CHECK(contains(h.error().message(), "no CUDA device"));
      auto ev = cuda::ipc_event::create();
      MP_CHECK(!ev.ok() && ev.error().code() == errc::unsupported);
    }
    MP_CHECK(cuda::can_access_peer(0, 0).value());
    return 0;
  }));
}

TEST_CASE("pinned staging reports no device and checks its arguments") {
  CHECK(in_child([] {
    auto bad = cuda::staging_buffers::create(16, 1);
    MP_CHECK(!bad.ok() && bad.error().code() == errc::invalid_argument);
    auto st = cuda::staging_buffers::create(1u << 20, 2);
    if (!cuda::available()) {
      MP_REQUIRE(!st.ok());
      MP_CHECK(st.error().code() == errc::unsupported);
      MP_CHECK(contains(st.error().message(), "no CUDA device"));
    } else {
      MP_REQUIRE_OK(st);
      MP_CHECK(st.value().slots() == 2);
    }
    // Argument checks come before any CUDA call or collective.
    struct no_comm {
      status allreduce(const void*, void*, std::size_t, dtype, reduce_op) {
        return status(errc::unsupported, "not called");
      }
    } comm;
    cuda::staging_buffers none;
    int x = 0;
    MP_CHECK(cuda::staged_allreduce(comm, &x, &x, 0, dtype::int32, reduce_op::sum, nullptr, none).ok());
    MP_CHECK(cuda::staged_allreduce(comm, nullptr, &x, 1, dtype::int32, reduce_op::sum, nullptr, none).code() ==
             errc::invalid_argument);
    MP_CHECK(cuda::staged_allreduce(comm, &x, &x, 1, dtype::int32, reduce_op::sum, nullptr, none).code() ==
             errc::invalid_argument);  // no staging buffers
    return 0;
  }));
}

TEST_CASE("NVML: loaded at run time, NVLinks counted by their far end, absence a clear status") {
  using cuda::nvml;
  // A library that is not there, and one that is not NVML.
  auto none = nvml::open("/nonexistent/libnvidia-ml.so.1");
  REQUIRE(!none.ok());
  CHECK(none.error().code() == errc::unsupported);
  CHECK(contains(none.error().message(), "/nonexistent/libnvidia-ml.so.1"));
  CHECK(contains(none.error().message(), "NVIDIA driver"));
  auto libc = nvml::open("libc.so.6");
  REQUIRE(!libc.ok());
  CHECK(contains(libc.error().message(), "lacks nvmlInit_v2"));
  // PCI ids as the CUDA runtime (4-digit domain) and NVML (8-digit) print them.
  CHECK(cuda::parse_pci_bus_id("0000:3b:00.0").value() == cuda::pci_address{0, 0x3b, 0});
  CHECK(cuda::parse_pci_bus_id("00000000:3B:00.0").value() == cuda::pci_address{0, 0x3b, 0});
  CHECK(cuda::parse_pci_bus_id("3b").error().code() == errc::invalid_argument);
  CHECK(!cuda::parse_pci_bus_id("0000:3b:00.0x").ok());
  // The stand-in (tests/gpu/fake_nvml.cpp): 4 links between the GPUs, 2 to a switch.
  // The build's path, or CCLITE_TEST_FAKE_NVML for a binary run on another
  // machine (tests/gpu/run.sh PREBUILT=1 carries the library beside it).
  const char* fake_path = std::getenv("CCLITE_TEST_FAKE_NVML");
  auto fake = nvml::open(fake_path && *fake_path ? fake_path : CCLITE_TEST_FAKE_NVML);
  REQUIRE(fake.ok());
  auto ab = fake.value()->links_between("0000:3b:00.0", "0000:5e:00.0");
  REQUIRE(ab.ok());
  CHECK(ab.value().to_peer == 4);
  CHECK(ab.value().other == 2);
  auto ba = fake.value()->links_between("0000:5e:00.0", "00000000:3B:00.0");
  REQUIRE(ba.ok());
  CHECK(ba.value().to_peer == 4);
  CHECK(ba.value().other == 0);
  auto to_switch = fake.value()->links_between("0000:3b:00.0", "0000:c1:00.0");
  CHECK(to_switch.value().to_peer == 2);
  auto unknown = fake.value()->links_between("0000:99:00.0", "0000:5e:00.0");
  REQUIRE(!unknown.ok());
  CHECK(unknown.error().code() == errc::unsupported);
  CHECK(contains(unknown.error().message(), "no device at PCI 0000:99:00.0: Not Found (6)"));
  CHECK(fake.value()->links_between("0000:3b:00.0", "nonsense").error().code() == errc::invalid_argument);
}

TEST_CASE("CUDA errors become statuses with the runtime text") {
  // cudaGetErrorName / cudaGetErrorString need no device (in a child all the same:
  // cuda_status also clears the runtime's last error).
  CHECK(in_child([] {
    status s = cuda::cuda_status(cudaErrorMemoryAllocation, "cudaMalloc");
    MP_CHECK(s.code() == errc::resource_exhausted);
    MP_CHECK(contains(s.message(), "cudaMalloc"));
    MP_CHECK(contains(s.message(), "cudaErrorMemoryAllocation"));
    MP_CHECK(contains(s.message(), cudaGetErrorString(cudaErrorMemoryAllocation)));
    MP_CHECK(cuda::cuda_status(cudaErrorInvalidValue, "x").code() == errc::invalid_argument);
    MP_CHECK(cuda::cuda_status(cudaErrorIllegalAddress, "x").code() == errc::system_error);
    status none = cuda::cuda_status(cudaErrorNoDevice, "cudaSetDevice");
    MP_CHECK(none.code() == errc::unsupported);
    MP_CHECK(contains(none.message(), "no CUDA device"));
    MP_CHECK(cuda::cuda_status(cudaSuccess, "x").ok());
    return 0;
  }));
}

TEST_CASE("CCLITE_GPU_BACKEND parsing") {
  using cuda::gpu_backend;
  CHECK(cuda::parse_gpu_backend(nullptr, true).value() == gpu_backend::nccl);
  CHECK(cuda::parse_gpu_backend("", false).value() == gpu_backend::native);
  CHECK(cuda::parse_gpu_backend("auto", true).value() == gpu_backend::nccl);
  CHECK(cuda::parse_gpu_backend("NCCL", true).value() == gpu_backend::nccl);
  CHECK(cuda::parse_gpu_backend("native", true).value() == gpu_backend::native);
  auto missing = cuda::parse_gpu_backend("nccl", false);
  REQUIRE(!missing.ok());
  CHECK(missing.error().code() == errc::unsupported);
  CHECK(contains(missing.error().message(), "CCLITE_GPU_BACKEND=native"));
  auto bad = cuda::parse_gpu_backend("gloo", true);
  REQUIRE(!bad.ok());
  CHECK(bad.error().code() == errc::invalid_argument);
  CHECK(contains(bad.error().message(), "'gloo'"));
  CHECK(contains(bad.error().message(), "nccl, native"));

  ::setenv("CCLITE_GPU_BACKEND", "native", 1);
  CHECK(cuda::gpu_backend_from_env(true).value() == gpu_backend::native);
  ::unsetenv("CCLITE_GPU_BACKEND");
  CHECK(cuda::gpu_backend_from_env(false).value() == gpu_backend::native);
#if defined(CCLITE_HAS_NCCL)
  CHECK(cuda::built_with_nccl());
#endif
}

TEST_CASE("CPU allreduce works in a binary that probed CUDA") {
  test::temp_dir dir;
  auto r = test::run_ranks(2, [&](int rank, int size) {
    // Probe first, as a GPU-aware program does at start-up, whatever the answer.
    const bool gpu = cuda::available();
    std::vector<float> host(1000, 0.0f);
    MP_CHECK(!cuda::is_device_pointer(host.data()));
    auto kv = test::open_dir_store(dir.path);
    auto comm = test::make_comm(*kv, rank, size);
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(rank + 1) * float(i % 7);
    MP_REQUIRE_OK(comm->allreduce(host.data(), host.size()));
    for (std::size_t i = 0; i < host.size(); ++i) MP_CHECK(host[i] == 3.0f * float(i % 7));
    std::vector<double> avg(33, double(rank));
    MP_REQUIRE_OK(comm->allreduce(avg.data(), avg.data(), avg.size(), dtype::float64, reduce_op::avg));
    for (double v : avg) MP_CHECK(v == 0.5);
    (void)gpu;
    return 0;
  }, std::chrono::seconds(120), [](int rank) { test::set_net_env(test::net::shm_only, rank, 2); });
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

TEST_CASE("device_communicator: host pointers take the host path") {
  CHECK(in_child([] {
    std::vector<float> a(16), b(16);
    MP_CHECK(cuda::route_of(a.data(), b.data()) == cuda::buffer_route::host);
    MP_CHECK(cuda::route_of(a.data(), a.data()) == cuda::buffer_route::host);
    MP_CHECK(cuda::route_of(nullptr, a.data()) == cuda::buffer_route::host);
    MP_CHECK(std::string(cuda::to_string(cuda::buffer_route::mixed)) == "mixed");
    if (cuda::available()) {
      auto d = cuda::device_buffer::allocate(64);
      MP_REQUIRE_OK(d);
      MP_CHECK(cuda::route_of(d.value().data(), d.value().data()) == cuda::buffer_route::device);
      MP_CHECK(cuda::route_of(a.data(), d.value().data()) == cuda::buffer_route::mixed);
    }
    return 0;
  }));
}

TEST_CASE("device_communicator without a device: clear status, CPU collectives go on") {
  test::temp_dir dir;
  auto r = test::run_ranks(2, [&](int rank, int size) {
    auto kv = test::open_dir_store(dir.path);
    auto comm = test::make_comm(*kv, rank, size);
    using dcomm = cuda::device_communicator<default_communicator>;
    cuda::device_options o;
    o.backend = "native";
    const auto t0 = clock::now();
    auto dc = dcomm::create(*comm, o);
    if (cuda::available()) {
      // With a GPU (two ranks may share it): the native engine, host pointers on the CPU path.
      MP_REQUIRE_OK(dc);
      MP_CHECK(dc.value()->engine() == cuda::gpu_backend::native);
      std::vector<std::int32_t> v(1000, rank + 1);
      MP_REQUIRE_OK(dc.value()->allreduce(v.data(), v.size()));
      for (auto x : v) MP_CHECK(x == 3);
    } else {
      MP_REQUIRE(!dc.ok());
      std::printf("cuda_test: rank %d: %s\n", rank, dc.error().to_string().c_str());
      MP_CHECK(dc.error().code() == errc::unsupported);
      MP_CHECK(contains(dc.error().message(), "no CUDA device"));
      MP_CHECK(contains(dc.error().message(), "device_communicator rank"));
      // Fails before any collective: no rank waits for the other.
      MP_CHECK(clock::now() - t0 < std::chrono::seconds(10));
      // A bad CCLITE_GPU_BACKEND is not what is reported without a device either:
      // the device comes first, the same answer on every rank.
      o.backend = "gloo";
      auto again = dcomm::create(*comm, o);
      MP_CHECK(!again.ok() && again.error().code() == errc::unsupported);
    }
    // The CPU communicator is untouched: host collectives work on.
    std::vector<double> x(4097, double(rank + 1));
    MP_REQUIRE_OK(comm->allreduce(x.data(), x.size()));
    for (double v : x) MP_CHECK(v == 3.0);
    MP_REQUIRE_OK(comm->barrier());
    return 0;
  }, std::chrono::seconds(120), [](int rank) { test::set_net_env(test::net::shm_only, rank, 2); });
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

TEST_CASE("device_buffers: device pointers in the communicator itself, or a clean no-device status") {
  test::temp_dir dir;
  auto r = test::run_ranks(2, [&](int rank, int size) {
    auto kv = test::open_dir_store(dir.path);
    auto comm = test::make_comm(*kv, rank, size);
    auto gpu = cuda::device_buffers<default_communicator>::enable(*comm);
    if (cuda::available()) {
      MP_REQUIRE_OK(gpu);
      MP_CHECK(comm->get_device_hook() == gpu.value().get());
      // Host memory is not the hook's: the CPU path (tests/gpu/device_comm_gpu.cpp does device memory).
      std::int32_t v[3] = {rank, rank, rank};
      MP_REQUIRE_OK(comm->allreduce(v, 3));
      MP_CHECK(v[0] == 1 && v[2] == 1);
      gpu.value().reset();
      MP_CHECK(comm->get_device_hook() == nullptr);
    } else {
      MP_REQUIRE(!gpu.ok());
      MP_CHECK(gpu.error().code() == errc::unsupported);
      MP_CHECK(contains(gpu.error().message(), "no CUDA device"));
      MP_CHECK(comm->get_device_hook() == nullptr);  // left as it was
    }
    std::vector<float> x(100, float(rank + 1));
    MP_REQUIRE_OK(comm->allreduce(x.data(), x.size()));
    for (float f : x) MP_CHECK(f == 3.0f);
    return 0;
  }, std::chrono::seconds(120), [](int rank) { test::set_net_env(test::net::shm_only, rank, 2); });
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

TEST_CASE("device_communicator argument checks need no device") {
  // What every device collective checks on the calling rank before anything is
  // enqueued (both engines): pure functions, no CUDA call.
  using cuda::detail::check_device_call;
  int x[8] = {}, y[8] = {};
  auto call = [&](collective_kind k, const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                  int root) { return op_desc::of(k, send, recv, count, t, op, root); };
  auto bad = [](const status& s, const char* words) {
    const bool ok = s.code() == errc::invalid_argument && contains(s.message(), words) &&
                    contains(s.message(), "device_communicator rank 1: device ");
    if (!ok) std::printf("cuda_test: expected invalid_argument with '%s', got %s\n", words, s.to_string().c_str());
    return ok;
  };
  const auto f32 = dtype::float32;
  const auto sum = reduce_op::sum;
  CHECK(check_device_call(call(collective_kind::broadcast, x, x, 4, f32, sum, 1), 1, 2).ok());
  CHECK(bad(check_device_call(call(collective_kind::broadcast, x, x, 4, f32, sum, 2), 1, 2), "broadcast: root 2"));
  CHECK(bad(check_device_call(call(collective_kind::broadcast, nullptr, nullptr, 4, f32, sum, 0), 1, 2), "null"));
  // broadcast does not reduce: its op is not looked at.
  CHECK(check_device_call(call(collective_kind::broadcast, x, x, 4, f32, static_cast<reduce_op>(42), 0), 1, 2).ok());
  CHECK(bad(check_device_call(call(collective_kind::reduce, x, x, 4, f32, static_cast<reduce_op>(42), 0), 1, 2),
            "reduce: invalid reduce_op 42"));
  CHECK(bad(check_device_call(call(collective_kind::reduce, x, x, 4, f32, sum, -1), 1, 2), "root -1"));
  CHECK(bad(check_device_call(call(collective_kind::reduce, nullptr, x, 4, f32, sum, 0), 1, 2), "null send"));
  // recv matters on the root only.
  CHECK(check_device_call(call(collective_kind::reduce, x, nullptr, 4, f32, sum, 0), 1, 2).ok());
  CHECK(bad(check_device_call(call(collective_kind::reduce, x, nullptr, 4, f32, sum, 1), 1, 2),
            "null recv buffer on the root (rank 1)"));
  CHECK(bad(check_device_call(call(collective_kind::allgather, x, nullptr, 4, f32, sum, 0), 1, 2), "allgather: null"));
  CHECK(bad(check_device_call(call(collective_kind::reduce_scatter, x, x, 4, static_cast<dtype>(42), sum, 0), 1, 2),
            "reduce_scatter: invalid dtype 42"));
  CHECK(bad(check_device_call(call(collective_kind::allgather, x, x, SIZE_MAX / 16, f32, sum, 0), 1, 2), "overflows"));
  // gather: send everywhere, recv on the root; scatter: recv everywhere, send on the root.
  CHECK(check_device_call(call(collective_kind::gather, x, nullptr, 4, f32, sum, 0), 1, 2).ok());
  CHECK(bad(check_device_call(call(collective_kind::gather, nullptr, x, 4, f32, sum, 0), 1, 2), "gather: null send"));
  CHECK(bad(check_device_call(call(collective_kind::gather, x, nullptr, 4, f32, sum, 1), 1, 2),
            "gather: null recv buffer on the root (rank 1)"));
  CHECK(check_device_call(call(collective_kind::scatter, nullptr, x, 4, f32, sum, 0), 1, 2).ok());
  CHECK(bad(check_device_call(call(collective_kind::scatter, x, nullptr, 4, f32, sum, 0), 1, 2), "scatter: null recv"));
  CHECK(bad(check_device_call(call(collective_kind::scatter, nullptr, x, 4, f32, sum, 1), 1, 2),
            "scatter: null send buffer on the root (rank 1)"));
  CHECK(bad(check_device_call(call(collective_kind::scatter, x, x, 4, f32, sum, 2), 1, 2), "scatter: root 2"));
  CHECK(bad(check_device_call(call(collective_kind::alltoall, x, nullptr, 4, f32, sum, 0), 1, 2), "alltoall: null"));
  // allgatherv: the send count is counts[rank]; the arrays must be there.
  {
    const std::size_t counts[2] = {3, 4}, displs[2] = {0, 3};
    op_desc v = call(collective_kind::allgatherv, x, y, 4, f32, sum, 0);
    v.counts = counts;
    v.displs = displs;
    CHECK(check_device_call(v, 1, 2).ok());
    v.count = 3;
    CHECK(bad(check_device_call(v, 1, 2), "allgatherv: send count 3 differs from counts[1] = 4"));
    v.counts = nullptr;
    CHECK(bad(check_device_call(v, 1, 2), "null counts"));
  }
  // sendrecv: to itself only while also receiving from itself.
  {
    op_desc sr = call(collective_kind::sendrecv, x, y, 4, f32, sum, 1);
    sr.peer2 = 0;
    sr.count2 = 4;
    CHECK(bad(check_device_call(sr, 1, 2), "cannot send to itself without receiving from itself"));
    sr.peer2 = 1;
    CHECK(check_device_call(sr, 1, 2).ok());
  }
  // Overlapping buffers other than the in-place form, as on the CPU (collective/op.hpp).
  CHECK(bad(check_device_call(call(collective_kind::allreduce, x, x + 1, 4, f32, sum, 0), 1, 2),
            "allreduce: the send buffer"));
  CHECK(bad(check_device_call(call(collective_kind::allgather, x, x, 2, f32, sum, 0), 1, 2),
            "in place: send == recv + rank() * count"));
  CHECK(check_device_call(call(collective_kind::allgather, x + 2, x, 2, f32, sum, 0), 1, 2).ok());
  // send / recv: `root` is the peer.
  CHECK(check_device_call(call(collective_kind::send, x, nullptr, 4, f32, sum, 0), 1, 2).ok());
  CHECK(bad(check_device_call(call(collective_kind::send, x, nullptr, 4, f32, sum, 2), 1, 2), "send: peer 2"));
  CHECK(bad(check_device_call(call(collective_kind::recv, nullptr, nullptr, 4, f32, sum, 0), 1, 2), "recv: null"));
  // Nothing to do: null buffers are fine with count 0.
  CHECK(check_device_call(call(collective_kind::allgather, nullptr, nullptr, 0, f32, sum, 0), 1, 2).ok());
  CHECK(check_device_call(call(collective_kind::reduce, nullptr, nullptr, 0, f32, sum, 1), 1, 2).ok());
  CHECK(check_device_call(call(collective_kind::reduce_scatter, x, x + 2, 2, f32, reduce_op::avg, 0), 1, 2).ok());
}

TEST_CASE("native engine chunking: the same cut on every rank, per rank for the per-rank collectives") {
  using cuda::detail::staged_chunk_elems;
  // Whole-buffer collectives: chunk_bytes / element size.
  CHECK(staged_chunk_elems(collective_kind::allreduce, dtype::float32, 8, 4u << 20).value() == (1u << 20));
  CHECK(staged_chunk_elems(collective_kind::broadcast, dtype::float64, 8, 100).value() == 12);
  CHECK(staged_chunk_elems(collective_kind::reduce, dtype::int8, 3, 64).value() == 64);
  // allgather / reduce_scatter: one piece of every rank per chunk.
  CHECK(staged_chunk_elems(collective_kind::allgather, dtype::float32, 2, 256u << 10).value() == (32u << 10));
  CHECK(staged_chunk_elems(collective_kind::reduce_scatter, dtype::bfloat16, 3, 100).value() == 16);
  CHECK(staged_chunk_elems(collective_kind::allgather, dtype::float64, 8, 64).value() == 1);
  // A chunk too small for one element of each rank: a clear error with the fix.
  auto small = staged_chunk_elems(collective_kind::reduce_scatter, dtype::float64, 9, 64);
  REQUIRE(!small.ok());
  CHECK(small.error().code() == errc::invalid_argument);
  CHECK(contains(small.error().message(), "device reduce_scatter"));
  CHECK(contains(small.error().message(), "chunk_bytes to at least 72"));
  CHECK(staged_chunk_elems(collective_kind::alltoall, dtype::int32, 4, 256).value() == 16);
  CHECK(staged_chunk_elems(collective_kind::gather, dtype::int32, 4, 256).value() == 16);
  for (collective_kind k : {collective_kind::allgather, collective_kind::reduce_scatter, collective_kind::gather,
                            collective_kind::scatter, collective_kind::alltoall})
    CHECK(cuda::detail::per_rank_pieces(k));
  CHECK(!cuda::detail::per_rank_pieces(collective_kind::broadcast));
}

TEST_CASE("CUDA IPC path: each allreduce segment reduced by one rank, aligned, covering the chunk") {
  using cuda::detail::ipc_segment_of;
  for (int ti = 0; ti < dtype_count; ++ti) {
    const std::size_t align = cuda::detail::ipc_align_elems(size_of(static_cast<dtype>(ti)));
    CHECK(align * size_of(static_cast<dtype>(ti)) == 16);
    for (int size = 1; size <= 9; ++size) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{63}, std::size_t{1000},
                            std::size_t{(1u << 20) + 3}}) {
        std::size_t next = 0;
        for (int q = 0; q < size; ++q) {
          const auto sg = ipc_segment_of(n, size, q, align);
          CHECK(sg.offset == next);  // contiguous, in rank order, no overlap
          if (sg.count) CHECK(sg.offset % align == 0);
          CHECK(sg.count <= (n + size - 1) / size + align - 1);
          next = sg.offset + sg.count;
        }
        CHECK(next == n);  // every element by exactly one rank
      }
    }
  }
  // Two ranks, 1000 floats: 500 each; three ranks: 336, 336, 328.
  CHECK(ipc_segment_of(1000, 2, 1, 4).offset == 500);
  CHECK(ipc_segment_of(1000, 3, 2, 4).count == 328);
}

namespace {
// The CUDA IPC path's plan (cuda/ipc_plan.hpp) run on host memory: `size`
// ranks in one process, each with a slot, a send and a recv buffer, in
// lockstep between exchanges as the events and barriers order them on a GPU.
// Checks that a rank reads a peer's slot only after waiting for that peer at
// the last exchange, and never a range its owner writes in the same phase.
struct plan_sim {
  struct op {
    enum kind_t { copy_in, copy_out, reduce } kind;
    int rank;
    bool to_slot;
    std::size_t a, b, bytes_or_elems;
    int q;  // copy_out: source rank; reduce: first rank
  };
  struct rank_trace {
    std::vector<std::vector<op>> phases{1};
    std::vector<int> from;  // per phase > 0: whom the exchange before it waited for
  };
  struct visitor {
    rank_trace& tr;
    int rank;
    void copy_in(std::size_t slot_off, std::size_t send_off, std::size_t bytes) {
      tr.phases.back().push_back({op::copy_in, rank, true, slot_off, send_off, bytes, rank});
    }
    void copy_out(std::size_t recv_off, int from, std::size_t slot_off, std::size_t bytes) {
      tr.phases.back().push_back({op::copy_out, rank, false, recv_off, slot_off, bytes, from});
    }
    void reduce(bool to_slot, std::size_t out_off, std::size_t slot_off, std::size_t elems, int first) {
      tr.phases.back().push_back({op::reduce, rank, to_slot, out_off, slot_off, elems, first});
    }
    void exchange(cuda::detail::ipc_event_kind, int from) {
      tr.phases.emplace_back();
      tr.from.push_back(from);
    }
  };
};

// One rank's buffers for a simulated call: inputs are small integers
// (gpu_test::input: exact in every dtype and summation order); recv starts as
// 0x5a. In place (broadcast always is): one buffer, send and recv where the
// communicator's in-place forms put them (gather / scatter: on the root only).
// send / recv: ranks 0 and 1 exchange (`root` is ignored: the peer is the other).
struct sim_buffers {
  std::vector<unsigned char> send, recv;
  unsigned char* send_at = nullptr;
  unsigned char* recv_at = nullptr;
};

bool sends_rows(collective_kind k) {
  return k == collective_kind::reduce_scatter || k == collective_kind::scatter || k == collective_kind::alltoall;
}
bool gets_rows(collective_kind k) {
  return k == collective_kind::allgather || k == collective_kind::gather || k == collective_kind::alltoall;
}

sim_buffers make_sim_buffers(collective_kind kind, dtype t, int size, int root, std::size_t count, int r, bool in_place) {
  const std::size_t es = size_of(t), un = static_cast<std::size_t>(size);
  const std::size_t send_elems = sends_rows(kind) ? count * un : count;
  const std::size_t recv_elems = gets_rows(kind) ? count * un : count;
  const std::size_t block = static_cast<std::size_t>(r) * count * es;
  if (kind == collective_kind::broadcast) in_place = true;
  sim_buffers b;
  b.recv.assign(std::max(recv_elems, send_elems) * es, 0x5a);
  b.send = gpu_test::input(t, send_elems, r);
  b.send_at = b.send.data();
  b.recv_at = b.recv.data();
  const bool rooted = kind == collective_kind::gather || kind == collective_kind::scatter;
  const bool p2p = kind == collective_kind::send || kind == collective_kind::recv;
  if (in_place && !p2p && (!rooted || r == root)) {
    const bool block_sent = kind == collective_kind::allgather || kind == collective_kind::gather;
    const bool block_got = kind == collective_kind::reduce_scatter || kind == collective_kind::scatter;
    b.send_at = b.recv.data() + (block_sent ? block : 0);
    b.recv_at = b.recv.data() + (block_got ? block : 0);
    if (!b.send.empty()) std::memcpy(b.send_at, b.send.data(), b.send.size());
  }
  return b;
}

// What rank r's recv_at holds after the call (as many bytes as make_sim_buffers
// gives recv); send / recv: rank 1 receives rank 0's input, rank 0 rank 1's.
std::vector<unsigned char> sim_expected(collective_kind kind, dtype t, reduce_op op, int size, int root,
                                        std::size_t count, int r, bool in_place) {
  const std::size_t es = size_of(t), un = static_cast<std::size_t>(size);
  const std::size_t send_elems = sends_rows(kind) ? count * un : count;
  const std::size_t recv_elems = gets_rows(kind) ? count * un : count;
  auto input = [&](int q, std::size_t n) { return gpu_test::input(t, n, q); };
  const reduction red = reduction_for(t, op);
  const std::size_t bb = count * es;  // bytes of one block
  std::vector<unsigned char> want(recv_elems * es, 0x5a);
  if (kind == collective_kind::send || kind == collective_kind::recv) {
    if (r < 2) want = input(1 - r, count);
  } else if (kind == collective_kind::gather) {
    // The non-roots' recv is not used: untouched.
    for (int q = 0; r == root && q < size; ++q) std::memcpy(want.data() + static_cast<std::size_t>(q) * bb, input(q, count).data(), bb);
  } else if (kind == collective_kind::scatter) {
    std::memcpy(want.data(), input(root, count * un).data() + static_cast<std::size_t>(r) * bb, bb);
  } else if (kind == collective_kind::alltoall) {
    for (int q = 0; q < size; ++q)
      std::memcpy(want.data() + static_cast<std::size_t>(q) * bb, input(q, count * un).data() + static_cast<std::size_t>(r) * bb, bb);
  } else if (kind == collective_kind::allgather) {
    for (int q = 0; q < size; ++q) std::memcpy(want.data() + static_cast<std::size_t>(q) * bb, input(q, count).data(), bb);
  } else if (kind == collective_kind::broadcast) {
    want = input(root, count);
  } else if (kind == collective_kind::reduce && r != root) {
    if (in_place) want = input(r, count);  // untouched
  } else {
    const std::size_t at = kind == collective_kind::reduce_scatter ? static_cast<std::size_t>(r) * count : 0;
    auto acc = input(0, send_elems);
    for (int q = 1; q < size; ++q) red.inplace(acc.data(), input(q, send_elems).data(), send_elems);
    if (red.needs_divide) red.divide(acc.data(), send_elems, size);
    std::memcpy(want.data(), acc.data() + at * es, count * es);
  }
  return want;
}

// The v-variants' simulated calls: rank r's counts and displacements
// (elements), ragged, some blocks empty, gaps between blocks (which the call
// must leave alone). allgatherv: sc / sd are every rank's counts / displs.
// alltoallv in place: a symmetric pattern and the recv layout both ways.
struct v_layout {
  std::vector<std::size_t> sc, sd, rc, rd;
  std::size_t send_total = 0, recv_total = 0;
};

v_layout v_layout_of(collective_kind k, int size, std::size_t count, int r, bool in_place) {
  const std::size_t n = static_cast<std::size_t>(size), me = static_cast<std::size_t>(r);
  v_layout v;
  v.sc.resize(n), v.sd.resize(n), v.rc.resize(n), v.rd.resize(n);
  auto prefix = [](const std::vector<std::size_t>& c, std::size_t gap, std::vector<std::size_t>& d) {
    std::size_t at = 0;
    for (std::size_t i = 0; i < c.size(); ++i, at += gap) d[i] = at, at += c[i];
    return at;
  };
  if (k == collective_kind::allgatherv) {
    for (std::size_t q = 0; q < n; ++q) v.sc[q] = q == 1 ? 0 : count + 3 * q;
    v.recv_total = prefix(v.sc, 2, v.sd);
    v.send_total = v.sc[me];
    v.rc = v.sc, v.rd = v.sd;
    return v;
  }
  auto f = [&](std::size_t a, std::size_t b) {
    return in_place ? (count + 3 * (a + b)) % (count + 5) : (count + 7 * a + 3 * b) % (count + 5);
  };
  for (std::size_t p = 0; p < n; ++p) v.sc[p] = f(me, p), v.rc[p] = f(p, me);
  v.send_total = prefix(v.sc, 1, v.sd);
  v.recv_total = prefix(v.rc, 2, v.rd);
  if (in_place) v.sd = v.rd, v.send_total = v.recv_total;
  return v;
}

sim_buffers make_v_buffers(collective_kind k, dtype t, const v_layout& v, int r, bool in_place) {
  const std::size_t es = size_of(t);
  sim_buffers b;
  b.recv.assign(v.recv_total * es, 0x5a);
  b.send = gpu_test::input(t, v.send_total, r);
  if (in_place && k == collective_kind::alltoallv) b.recv = b.send;
  b.send_at = b.send.data();
  b.recv_at = b.recv.data();
  if (in_place && k == collective_kind::alltoallv) b.send_at = b.recv_at;
  if (in_place && k == collective_kind::allgatherv) {
    b.send_at = b.recv.data() + v.sd[static_cast<std::size_t>(r)] * es;
    if (!b.send.empty()) std::memcpy(b.send_at, b.send.data(), b.send.size());
  }
  return b;
}

std::vector<unsigned char> v_expected(collective_kind k, dtype t, int size, std::size_t count, int r, bool in_place) {
  const std::size_t es = size_of(t);
  const v_layout v = v_layout_of(k, size, count, r, in_place);
  std::vector<unsigned char> want(v.recv_total * es, 0x5a);
  if (in_place && k == collective_kind::alltoallv) want = gpu_test::input(t, v.recv_total, r);
  for (int q = 0; q < size; ++q) {
    const std::size_t uq = static_cast<std::size_t>(q);
    if (k == collective_kind::allgatherv) {
      if (v.sc[uq] == 0) continue;  // an empty block: memcpy from an empty vector's null data() is UB
      std::memcpy(want.data() + v.sd[uq] * es, gpu_test::input(t, v.sc[uq], q).data(), v.sc[uq] * es);
    } else {
      const v_layout vq = v_layout_of(k, size, count, q, in_place);
      const auto from = gpu_test::input(t, vq.send_total, q);
      if (v.rc[uq]) std::memcpy(want.data() + v.rd[uq] * es, from.data() + vq.sd[static_cast<std::size_t>(r)] * es, v.rc[uq] * es);
    }
  }
  return want;
}

// The largest block any rank sends or receives: the v-variants' chunk count.
std::size_t v_largest(collective_kind k, int size, std::size_t count, bool in_place) {
  std::size_t m = 0;
  for (int q = 0; q < size; ++q) {
    const v_layout v = v_layout_of(k, size, count, q, in_place);
    for (std::size_t i = 0; i < v.sc.size(); ++i) m = std::max({m, v.sc[i], v.rc[i]});
  }
  return m;
}

// Runs the IPC plan of `call` (rank and per-rank fields set by `prepare(call,
// r)`) over the ranks' buffers in lockstep; returns the number of problems
// (unwaited reads, write/read overlaps; results are the caller's to check).
template <class Prepare>
std::size_t run_ipc_sim(cuda::detail::ipc_call call, std::size_t chunk_bytes, std::vector<sim_buffers>& buf, dtype t,
                        reduce_op op, Prepare&& prepare, std::string& why) {
  const std::size_t es = size_of(t);
  const int size = call.size;
  const std::size_t un = static_cast<std::size_t>(size);
  std::vector<std::vector<unsigned char>> slot(un, std::vector<unsigned char>(chunk_bytes));
  const reduction red = reduction_for(t, op);
  std::size_t problems = 0;
  auto complain = [&](const std::string& w) {
    if (why.empty()) why = w;
    ++problems;
  };
  for (std::size_t c = 0; c < call.chunks(); ++c) {
    std::vector<plan_sim::rank_trace> tr(un);
    for (int r = 0; r < size; ++r) {
      call.rank = r;
      prepare(call, r);
      plan_sim::visitor v{tr[r], r};
      cuda::detail::ipc_chunk_plan(call, c, v);
    }
    std::size_t phases = 0;
    for (auto& x : tr) phases = std::max(phases, x.phases.size());
    for (std::size_t p = 0; p < phases; ++p) {
      // Ranges written to each rank's slot and read from it in this phase.
      std::vector<std::vector<std::pair<std::size_t, std::size_t>>> wr(un), rd(un);
      auto reads_slot = [&](int reader, int owner, std::size_t at, std::size_t bytes) {
        if (owner != reader) {
          const int from = p == 0 ? -3 : tr[reader].from[p - 1];
          if (p == 0 || !(from == -1 || from == owner)) complain("rank " + std::to_string(reader) + " reads rank " + std::to_string(owner) + "'s slot without waiting for it");
        }
        rd[owner].push_back({at, at + bytes});
      };
      for (int r = 0; r < size; ++r) {
        if (p >= tr[r].phases.size()) continue;
        for (const auto& o : tr[r].phases[p]) {
          const std::size_t out_bytes = o.kind == plan_sim::op::reduce ? o.bytes_or_elems * es : o.bytes_or_elems;
          if (o.kind == plan_sim::op::copy_in) {
            wr[r].push_back({o.a, o.a + out_bytes});
            std::memcpy(slot[r].data() + o.a, buf[r].send_at + o.b, out_bytes);
          } else if (o.kind == plan_sim::op::copy_out) {
            reads_slot(r, o.q, o.b, out_bytes);
            std::memmove(buf[r].recv_at + o.a, slot[o.q].data() + o.b, out_bytes);
          } else {
            for (int j = 0; j < size; ++j) reads_slot(r, (o.q + j) % size, o.b, out_bytes);
            unsigned char* out = (o.to_slot ? slot[r].data() : buf[r].recv_at) + o.a;
            if (o.to_slot) wr[r].push_back({o.a, o.a + out_bytes});
            std::vector<unsigned char> acc(slot[o.q].begin() + static_cast<std::ptrdiff_t>(o.b),
                                           slot[o.q].begin() + static_cast<std::ptrdiff_t>(o.b + out_bytes));
            for (int j = 1; j < size; ++j) red.inplace(acc.data(), slot[(o.q + j) % size].data() + o.b, o.bytes_or_elems);
            if (red.needs_divide) red.divide(acc.data(), o.bytes_or_elems, size);
            std::memcpy(out, acc.data(), out_bytes);
          }
        }
      }
      // A range a rank writes in its slot may not be read by anyone else in the same phase.
      for (int owner = 0; owner < size; ++owner)
        for (const auto& w : wr[owner])
          for (int reader = 0; reader < size; ++reader) {
            if (reader == owner || p >= tr[reader].phases.size()) continue;
            for (const auto& o : tr[reader].phases[p]) {
              const bool touches = (o.kind == plan_sim::op::copy_out && o.q == owner) || o.kind == plan_sim::op::reduce;
              const std::size_t bytes = o.kind == plan_sim::op::reduce ? o.bytes_or_elems * es : o.bytes_or_elems;
              if (touches && o.b < w.second && w.first < o.b + bytes) complain("a slot range is written while a peer reads it");
            }
          }
    }
  }
  return problems;
}

// Runs `kind` over `size` ranks with the plan; returns the number of problems
// (wrong bytes, unwaited reads, write/read overlaps) and fills `why`.
std::size_t simulate_ipc(collective_kind kind, dtype t, reduce_op op, int size, int root, std::size_t count,
                         std::size_t chunk_bytes, bool in_place, std::string& why) {
  const std::size_t es = size_of(t);
  auto per = cuda::detail::staged_chunk_elems(kind, t, size, chunk_bytes);
  if (!per) {
    why = per.error().message();
    return 1;
  }
  std::vector<sim_buffers> buf;
  for (int r = 0; r < size; ++r) buf.push_back(make_sim_buffers(kind, t, size, root, count, r, in_place));
  cuda::detail::ipc_call call;
  call.kind = kind;
  call.size = size;
  call.root = root;
  call.count = count;
  call.elem = es;
  call.per_chunk = per.value();
  std::size_t problems = run_ipc_sim(call, chunk_bytes, buf, t, op, [&](cuda::detail::ipc_call& c, int r) {
    c.own_block_in_place = cuda::detail::own_block_in_place(kind, buf[r].send_at, buf[r].recv_at, count * es, r, root);
  }, why);
  for (int r = 0; r < size; ++r) {
    const auto want = sim_expected(kind, t, op, size, root, count, r, in_place);
    if (std::memcmp(buf[r].recv_at, want.data(), want.size()) != 0) {
      if (why.empty()) why = "rank " + std::to_string(r) + ": wrong result";
      ++problems;
    }
  }
  return problems;
}

// The same for allgatherv / alltoallv with v_layout's counts.
std::size_t simulate_ipc_v(collective_kind kind, dtype t, int size, std::size_t count, std::size_t chunk_bytes,
                           bool in_place, std::string& why) {
  const std::size_t es = size_of(t);
  auto per = cuda::detail::staged_chunk_elems(kind, t, size, chunk_bytes);
  if (!per) {
    why = per.error().message();
    return 1;
  }
  std::vector<v_layout> lay;
  std::vector<sim_buffers> buf;
  for (int r = 0; r < size; ++r) {
    lay.push_back(v_layout_of(kind, size, count, r, in_place));
    buf.push_back(make_v_buffers(kind, t, lay.back(), r, in_place));
  }
  cuda::detail::ipc_call call;
  call.kind = kind;
  call.size = size;
  call.count = v_largest(kind, size, count, in_place);
  call.elem = es;
  call.per_chunk = per.value();
  std::size_t problems = run_ipc_sim(call, chunk_bytes, buf, t, reduce_op::sum, [&](cuda::detail::ipc_call& c, int r) {
    const v_layout& v = lay[static_cast<std::size_t>(r)];
    c.counts = v.sc.data(), c.displs = v.sd.data(), c.rcounts = v.rc.data(), c.rdispls = v.rd.data();
    c.own_block_in_place = kind == collective_kind::allgatherv && buf[r].send_at == buf[r].recv_at + v.sd[static_cast<std::size_t>(r)] * es;
  }, why);
  for (int r = 0; r < size; ++r) {
    const auto want = v_expected(kind, t, size, count, r, in_place);
    if (std::memcmp(buf[r].recv_at, want.data(), want.size()) != 0) {
      if (why.empty()) why = "rank " + std::to_string(r) + ": wrong result";
      ++problems;
    }
  }
  return problems;
}
}  // namespace

namespace {
// The staged path's plan (cuda/staged_plan.hpp) with memcpy for the device
// copies and this rank's real CPU communicator for the host call.
template <class Comm>
struct staged_sim {
  Comm& comm;
  const cuda::detail::staged_call& call;
  dtype t;
  reduce_op op;
  const unsigned char* src;
  unsigned char* dst;
  std::vector<unsigned char>& slot;
  status st;
  std::size_t c = 0;  // the chunk
  cuda::detail::staged_v_chunk vc{};
  void down(std::size_t slot_off, std::size_t src_off, std::size_t src_pitch, std::size_t width, std::size_t rows) {
    for (std::size_t r = 0; r < rows; ++r) std::memcpy(slot.data() + slot_off + r * width, src + src_off + r * src_pitch, width);
  }
  void host(std::size_t n) {
    if (cuda::detail::counts_per_chunk(call.kind)) cuda::detail::staged_v_counts(call, c, vc);
    if (st.ok()) st = cuda::detail::staged_host_call(comm, call.kind, slot.data(), n, t, op, call.root, &vc);
  }
  void up(std::size_t dst_off, std::size_t dst_pitch, std::size_t slot_off, std::size_t width, std::size_t rows) {
    for (std::size_t r = 0; r < rows; ++r) std::memcpy(dst + dst_off + r * dst_pitch, slot.data() + slot_off + r * width, width);
  }
};

// One call through the staged plan on `comm`; ok or the CPU call's error.
// The v-variants: `v` is this rank's layout, `count` the largest block.
template <class Comm>
status run_staged(Comm& comm, collective_kind kind, dtype t, reduce_op op, int root, std::size_t count,
                  std::size_t chunk_bytes, const unsigned char* send, unsigned char* recv,
                  const v_layout* v = nullptr, std::size_t count2 = 0, int peer2 = 0) {
  auto per = cuda::detail::staged_chunk_elems(kind, t, comm.size(), chunk_bytes);
  if (!per) return per.error();
  cuda::detail::staged_call call;
  call.kind = kind;
  call.rank = comm.rank();
  call.size = comm.size();
  call.root = root;
  call.count = count;
  call.elem = size_of(t);
  call.per_chunk = per.value();
  if (v) call.counts = v->sc.data(), call.displs = v->sd.data(), call.rcounts = v->rc.data(), call.rdispls = v->rd.data();
  call.count2 = count2;  // sendrecv
  call.peer2 = peer2;
  std::vector<unsigned char> slot(chunk_bytes, 0xee);
  staged_sim<Comm> sim{comm, call, t, op, send, recv, slot, {}};
  for (std::size_t c = 0; c < call.chunks() && sim.st.ok(); ++c) {
    sim.c = c;
    cuda::detail::staged_chunk_plan(call, c, sim);
  }
  return sim.st;
}
}  // namespace

TEST_CASE("staged path: its plan, with a real CPU communicator, gives every collective's result") {
  const collective_kind kinds[] = {collective_kind::allreduce, collective_kind::broadcast, collective_kind::reduce,
                                   collective_kind::allgather, collective_kind::reduce_scatter, collective_kind::gather,
                                   collective_kind::scatter, collective_kind::alltoall, collective_kind::send};
  for (int size : {2, 3}) {
    test::temp_dir dir;
    auto r = test::run_ranks(size, [&](int rank, int n) {
      auto kv = test::open_dir_store(dir.path);
      auto comm = test::make_comm(*kv, rank, n);
      int cases = 0;
      for (collective_kind k : kinds)
        for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{100}, std::size_t{1237}})
          for (dtype t : {dtype::float32, dtype::int8})
            for (bool in_place : {false, true}) {
              const reduce_op op = t == dtype::int8 ? reduce_op::max : reduce_op::avg;
              const int root = static_cast<int>(count % static_cast<std::size_t>(n));
              sim_buffers b = make_sim_buffers(k, t, n, root, count, rank, in_place);
              // 256-byte slots: several chunks, ragged last ones.
              if (k == collective_kind::send) {
                // Ranks 0 and 1 exchange: 0 sends then receives, 1 the reverse.
                if (rank > 1) continue;
                const collective_kind first = rank == 0 ? collective_kind::send : collective_kind::recv;
                const collective_kind second = rank == 0 ? collective_kind::recv : collective_kind::send;
                MP_REQUIRE_OK(run_staged(*comm, first, t, op, 1 - rank, count, 256, b.send_at, b.recv_at));
                MP_REQUIRE_OK(run_staged(*comm, second, t, op, 1 - rank, count, 256, b.send_at, b.recv_at));
              } else {
                MP_REQUIRE_OK(run_staged(*comm, k, t, op, root, count, 256, b.send_at, b.recv_at));
              }
              const auto want = sim_expected(k, t, op, n, root, count, rank, in_place);
              if (std::memcmp(b.recv_at, want.data(), want.size()) != 0) {
                std::fprintf(stderr, "rank %d: staged %s, %d ranks, %zu x %s%s: wrong result\n", rank, to_string(k), n,
                             count, to_string(t), in_place ? " in place" : "");
                MP_CHECK(false);
              }
              ++cases;
            }
      for (collective_kind k : {collective_kind::allgatherv, collective_kind::alltoallv})
        for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{100}, std::size_t{1237}})
          for (dtype t : {dtype::float32, dtype::int8})
            for (bool in_place : {false, true}) {
              const v_layout v = v_layout_of(k, n, count, rank, in_place);
              sim_buffers b = make_v_buffers(k, t, v, rank, in_place);
              MP_REQUIRE_OK(run_staged(*comm, k, t, reduce_op::sum, 0, v_largest(k, n, count, in_place), 256,
                                       b.send_at, b.recv_at, &v));
              const auto want = v_expected(k, t, n, count, rank, in_place);
              if (std::memcmp(b.recv_at, want.data(), want.size()) != 0) {
                std::fprintf(stderr, "rank %d: staged %s, %d ranks, %zu x %s%s: wrong result\n", rank, to_string(k), n,
                             count, to_string(t), in_place ? " in place" : "");
                MP_CHECK(false);
              }
              ++cases;
            }
      // sendrecv: a ring shift, each rank sending a different count, so the two
      // directions of one rank's call run out at different chunks.
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{100}, std::size_t{1237}}) {
        const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        const std::size_t out = count + 40 * static_cast<std::size_t>(rank);
        const std::size_t in = count + 40 * static_cast<std::size_t>(prev);
        const auto x = gpu_test::input(dtype::float32, out, rank);
        std::vector<unsigned char> got(in * 4, 0x5a);
        MP_REQUIRE_OK(run_staged(*comm, collective_kind::sendrecv, dtype::float32, reduce_op::sum, next, out, 256,
                                 x.data(), got.data(), nullptr, in, prev));
        if (got != gpu_test::input(dtype::float32, in, prev)) {
          std::fprintf(stderr, "rank %d: staged sendrecv, %d ranks, %zu out / %zu in: wrong result\n", rank, n, out, in);
          MP_CHECK(false);
        }
        ++cases;
      }
      MP_CHECK(cases == (rank > 1 ? 164 : 180));
      return 0;
    }, std::chrono::seconds(120), [size](int rank) { test::set_net_env(test::net::shm_only, rank, size); });
    CHECK_MESSAGE(r.all_ok(), r.describe());
  }
}

TEST_CASE("CUDA IPC path: its plan, run on host memory, gives every collective's result and waits before it reads") {
  const collective_kind kinds[] = {collective_kind::allreduce, collective_kind::broadcast, collective_kind::reduce,
                                   collective_kind::allgather, collective_kind::reduce_scatter, collective_kind::gather,
                                   collective_kind::scatter, collective_kind::alltoall};
  int cases = 0;
  for (collective_kind k : kinds)
    for (int size : {2, 3, 4})
      for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{100}, std::size_t{1237}})
        for (dtype t : {dtype::float32, dtype::int8})
          for (bool in_place : {false, true}) {
            const reduce_op op = t == dtype::int8 ? reduce_op::max : reduce_op::avg;
            const int root = static_cast<int>(count % static_cast<std::size_t>(size));
            // 256-byte slots: several chunks, ragged last ones.
            std::string why;
            const std::size_t bad = simulate_ipc(k, t, op, size, root, count, 256, in_place, why);
            INFO(std::string(to_string(k)), " ", size, " ranks, ", count, " x ", std::string(to_string(t)),
                 std::string(in_place ? " in place" : ""), ": ", why);
            CHECK(bad == 0);
            ++cases;
          }
  for (collective_kind k : {collective_kind::allgatherv, collective_kind::alltoallv})
    for (int size : {2, 3, 4})
      for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{100}, std::size_t{1237}})
        for (dtype t : {dtype::float32, dtype::int8})
          for (bool in_place : {false, true}) {
            std::string why;
            const std::size_t bad = simulate_ipc_v(k, t, size, count, 256, in_place, why);
            INFO(std::string(to_string(k)), " ", size, " ranks, ", count, " x ", std::string(to_string(t)),
                 std::string(in_place ? " in place" : ""), ": ", why);
            CHECK(bad == 0);
            ++cases;
          }
  CHECK(cases == 480);
}

TEST_CASE("CUDA IPC path: taken only when every condition holds, else a reason a user can act on") {
  using cuda::detail::ipc_facts;
  using cuda::detail::ipc_ineligible_reason;
  ipc_facts f;
  f.size = f.local_size = 2;
  CHECK(ipc_ineligible_reason(f).empty());
  auto why = [&](auto change) {
    ipc_facts g = f;
    change(g);
    return ipc_ineligible_reason(g);
  };
  CHECK(contains(why([](ipc_facts& g) { g.enabled = false; }), "CCLITE_CUDA_IPC=0"));
  CHECK(contains(why([](ipc_facts& g) { g.kernels_linked = false; }), "device_reduce_entry.cuh"));
  CHECK(contains(why([](ipc_facts& g) { g.size = g.local_size = 1; }), "single rank"));
  CHECK(contains(why([](ipc_facts& g) { g.size = 4; }), "not all on one node"));
  CHECK(contains(why([](ipc_facts& g) { g.peers_reachable = false; }), "peer access"));
  CHECK(contains(why([](ipc_facts& g) { g.slots = 1; }), "at least 2 staging slots"));
}

TEST_CASE("CUDA IPC path: ranks sharing a GPU without MPS stage their small collectives") {
  using cuda::detail::auto_ipc_min_bytes;
  CHECK(auto_ipc_min_bytes(true, false) == (1 << 20));
  CHECK(auto_ipc_min_bytes(true, true) == 0);
  CHECK(auto_ipc_min_bytes(false, false) == 0);
  CHECK(auto_ipc_min_bytes(false, true) == 0);
  // MPS is found by its control daemon's files in CUDA_MPS_PIPE_DIRECTORY:
  // the `control` socket and a pid file naming a live process. What a daemon
  // leaves after `quit` (the socket alone) or a kill -9 (a dead pid) reads as
  // absent (a child: the variable must not leak into the other cases).
  CHECK(in_child([] {
    char tmpl[] = "/tmp/cclite-mps-XXXXXX";
    const char* dir = ::mkdtemp(tmpl);
    MP_CHECK(dir != nullptr);
    ::setenv("CUDA_MPS_PIPE_DIRECTORY", dir, 1);
    const std::string control = std::string(dir) + "/control", pidfile = std::string(dir) + "/nvidia-cuda-mps-control.pid";
    auto write = [](const std::string& path, const std::string& text) {
      std::FILE* f = std::fopen(path.c_str(), "w");
      if (!f) return false;
      std::fputs(text.c_str(), f);
      return std::fclose(f) == 0;
    };
    const bool none = cuda::detail::mps_daemon_present();
    MP_CHECK(write(control, ""));
    const bool after_quit = cuda::detail::mps_daemon_present();
    MP_CHECK(write(pidfile, std::to_string(::getpid())));  // as the daemon writes it: no newline
    const bool running = cuda::detail::mps_daemon_present();
    const pid_t gone = ::fork();
    if (gone == 0) ::_exit(0);
    MP_CHECK(gone > 0 && ::waitpid(gone, nullptr, 0) == gone);
    MP_CHECK(write(pidfile, std::to_string(gone)));
    const bool after_kill = cuda::detail::mps_daemon_present();
    std::remove(pidfile.c_str());
    std::remove(control.c_str());
    ::rmdir(dir);
    MP_CHECK(!none);
    MP_CHECK(!after_quit);
    MP_CHECK(running);
    MP_CHECK(!after_kill);
    return 0;
  }));
}

TEST_CASE("the device reduction kernels are linked into programs using cclite::cuda") {
#if defined(CCLITE_TEST_KERNELS_LINKED)
  // This build compiled transports/cuda/src/device_reduce.cu with nvcc.
  CHECK(cuda::device_reduce_linked());
  // The nvcc-compiled entry runs here too: its argument checks come before any
  // CUDA call, so they answer the same with or without a GPU.
  float x = 0;
  CHECK(cuda::device_reduce(nullptr, &x, &x, 4, dtype::float32, reduce_op::sum, 0, nullptr) == cudaErrorInvalidValue);
  CHECK(cuda::device_reduce(&x, &x, &x, 0, dtype::float32, reduce_op::sum, 0, nullptr) == cudaSuccess);
  CHECK(cclite_cuda_device_reduce(&x, &x, &x, 4, 42, 0, 0, nullptr) == cudaErrorInvalidValue);
  CHECK(cclite_cuda_device_reduce(&x, &x, &x, 4, 0, 17, 0, nullptr) == cudaErrorInvalidValue);
#else
  // No nvcc in this build: the weak reference stays null and the IPC path steps aside.
  CHECK(!cuda::device_reduce_linked());
  float x = 0;
  CHECK(cuda::device_reduce(&x, &x, &x, 4, dtype::float32, reduce_op::sum, 0, nullptr) == cudaErrorNotSupported);
#endif
}

// data_parallel's device-memory hook is chosen by type: the adapter declares it
// (and has no shared window to offer), CPU communicators do not. Every member of
// the device form compiles (explicit instantiation), GPU or not.
template class cclite::train::data_parallel<cclite::cuda::device_comm_adapter<cclite::default_communicator>>;
template class cclite::cuda::device_buffers<cclite::default_communicator>;  // every member compiles
static_assert(cuda::device_data_parallel<default_communicator>::on_device);
static_assert(!train::data_parallel<default_communicator>::on_device);
static_assert(!train::detail::has_alloc_shared<cuda::device_comm_adapter<default_communicator>>::value);

TEST_CASE("data_parallel on a CPU communicator: host memory, grad(p) / value(p) are the parameter's own") {
  test::temp_dir dir;
  auto r = test::run_ranks(2, [&](int rank, int size) {
    auto kv = test::open_dir_store(dir.path);
    auto comm = test::make_comm(*kv, rank, size);
    train::parameter w("fc1.weight", 12), b("fc1.bias", 3), other("x", 4);
    for (float& v : w.values()) v = float(rank + 1);
    for (float& v : b.values()) v = float(rank + 2);
    auto made = train::data_parallel<default_communicator>::create(*comm, {&w, &b});
    MP_REQUIRE_OK(made);
    auto& ddp = made.value();
    MP_CHECK(w.values()[11] == 1.0f && b.values()[0] == 2.0f);  // rank 0's
    MP_CHECK(ddp.value(w) == w.value() && ddp.value(b) == b.value());
    MP_CHECK(ddp.grad(w) == w.grad() && ddp.grad(b) == b.grad());
    MP_CHECK(ddp.flat_values() == nullptr && ddp.value(other) == nullptr && ddp.grad(other) == nullptr);
    MP_CHECK(ddp.grad(w) >= ddp.flat_grad() && ddp.grad(w) < ddp.flat_grad() + ddp.flat_size());
    for (std::size_t i = 0; i < 12; ++i) w.grad()[i] = float(rank);
    for (std::size_t i = 0; i < 3; ++i) b.grad()[i] = float(2 * rank);
    ddp.grad_ready(w);
    ddp.grad_ready(b);
    MP_REQUIRE_OK(ddp.synchronize());
    MP_CHECK(w.grad()[5] == 0.5f && b.grad()[2] == 1.0f);
    ddp.zero_grad();
    MP_CHECK(w.grad()[0] == 0.0f && b.grad()[1] == 0.0f);
    (void)size;
    return 0;
  }, std::chrono::seconds(120), [](int rank) { test::set_net_env(test::net::shm_only, rank, 2); });
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

#if defined(CCLITE_HAS_NCCL)

TEST_CASE("NCCL unique id over a CPU communicator") {
  // broadcast_unique_id: the device communicator's way (no store needed); no GPU needed.
  test::temp_dir dir;
  auto r = test::run_ranks(2, [&](int rank, int size) {
    auto kv = test::open_dir_store(dir.path);
    auto comm = test::make_comm(*kv, rank, size);
    auto id = nccl::broadcast_unique_id(*comm);
    MP_REQUIRE_OK(id);
    std::uint64_t h = 1469598103934665603ull;
    const auto* p = reinterpret_cast<const unsigned char*>(&id.value());
    bool nonzero = false;
    for (std::size_t i = 0; i < sizeof(ncclUniqueId); ++i) h = (h ^ p[i]) * 1099511628211ull, nonzero |= p[i] != 0;
    MP_CHECK(nonzero);
    std::uint64_t lo = h, hi = h;
    MP_REQUIRE_OK(comm->allreduce(&lo, 1, reduce_op::min));
    MP_REQUIRE_OK(comm->allreduce(&hi, 1, reduce_op::max));
    MP_CHECK(lo == hi);  // every rank holds rank 0's id
    if (!cuda::available()) {
      auto b = nccl::backend::create_with_id(id.value(), rank, size);
      MP_CHECK(!b.ok() && b.error().code() == errc::unsupported);
      MP_CHECK(contains(b.error().message(), "no CUDA device"));
    }
    return 0;
  }, std::chrono::seconds(120), [](int rank) { test::set_net_env(test::net::shm_only, rank, 2); });
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

TEST_CASE("NCCL dtype and op mapping") {
  const ncclDataType_t expect[] = {ncclInt8,  ncclUint8,    ncclInt32,    ncclUint32,  ncclInt64,
                                   ncclUint64, ncclFloat16, ncclBfloat16, ncclFloat32, ncclFloat64};
  for (int i = 0; i < dtype_count; ++i) {
    auto t = static_cast<dtype>(i);
    CAPTURE(to_string(t));
    REQUIRE(nccl::to_nccl(t).ok());
    CHECK(nccl::to_nccl(t).value() == expect[i]);
  }
  CHECK(nccl::to_nccl(reduce_op::sum).value() == ncclSum);
  CHECK(nccl::to_nccl(reduce_op::prod).value() == ncclProd);
  CHECK(nccl::to_nccl(reduce_op::min).value() == ncclMin);
  CHECK(nccl::to_nccl(reduce_op::max).value() == ncclMax);
  CHECK(nccl::to_nccl(reduce_op::avg).value() == ncclAvg);
  CHECK(nccl::to_nccl(static_cast<dtype>(42)).error().code() == errc::invalid_argument);
  CHECK(nccl::to_nccl(static_cast<reduce_op>(9)).error().code() == errc::invalid_argument);
  CHECK(in_child([] {  // NCCL library calls: in a child, as the CUDA ones
    status s = nccl::nccl_status(ncclInvalidUsage, "ncclAllReduce");
    MP_CHECK(s.code() == errc::invalid_argument);
    MP_CHECK(contains(s.message(), "ncclAllReduce"));
    MP_CHECK(nccl::nccl_status(ncclRemoteError, "x").code() == errc::peer_lost);
    MP_CHECK(nccl::version_string().find('.') != std::string::npos);
    return 0;
  }));
}

TEST_CASE("NCCL unique id travels through the store") {
  // ncclGetUniqueId needs no GPU, so the bootstrap is tested on every machine.
  test::temp_dir dir;
  auto r = test::run_ranks(3, [&](int rank, int) {
    auto kv = test::open_dir_store(dir.path);
    auto id = nccl::exchange_unique_id(*kv, "job/nccl_id", rank, deadline::after(milliseconds(30000)));
    MP_REQUIRE_OK(id);
    std::string mine(reinterpret_cast<const char*>(&id.value()), sizeof(ncclUniqueId));
    // Every rank publishes what it got; rank 0 compares them all.
    MP_REQUIRE_OK(kv->set("seen/" + std::to_string(rank), mine));
    if (rank == 0) {
      for (int p = 1; p < 3; ++p) {
        auto v = kv->get("seen/" + std::to_string(p), deadline::after(milliseconds(30000)));
        MP_REQUIRE_OK(v);
        MP_CHECK(v.value() == mine);
      }
      MP_CHECK(mine != std::string(sizeof(ncclUniqueId), '\0'));
    }
    return 0;
  });
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

TEST_CASE("NCCL unique id wait is bounded and checks its size") {
  CHECK(in_child([] {
    memory_store kv;
    auto late = nccl::exchange_unique_id(kv, "never", 1, deadline::after(milliseconds(100)));
    MP_CHECK(!late.ok() && late.error().code() == errc::timeout);
    MP_CHECK(contains(late.error().message(), "NCCL unique id"));
    MP_REQUIRE_OK(kv.set("short", "abc"));
    auto bad = nccl::exchange_unique_id(kv, "short", 1, deadline::after(milliseconds(100)));
    MP_CHECK(!bad.ok() && bad.error().code() == errc::protocol_error);
    return 0;
  }));
}

TEST_CASE("NCCL backend without a device fails fast on every rank") {
  test::temp_dir dir;
  auto r = test::run_ranks(2, [&](int rank, int size) {
    if (cuda::available()) return 0;  // with a GPU, tests/gpu/run.sh covers the backend
    auto kv = test::open_dir_store(dir.path);
    nccl::options o;
    o.timeout = milliseconds(20000);
    const auto t0 = clock::now();
    auto b = nccl::backend::create(*kv, rank, size, o);
    MP_REQUIRE(!b.ok());
    std::printf("cuda_test: rank %d: %s\n", rank, b.error().to_string().c_str());
    MP_CHECK(b.error().code() == errc::unsupported);
    MP_CHECK(contains(b.error().message(), "no CUDA device"));
    // Fails before the store is touched: no rank waits for the other's id.
    MP_CHECK(clock::now() - t0 < std::chrono::seconds(10));
    MP_CHECK(!kv->check("cclite/nccl/unique_id").value());
    return 0;
  });
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

TEST_CASE("NCCL backend rejects a bad rank") {
  memory_store kv;
  auto b = nccl::backend::create(kv, 2, 2);
  REQUIRE(!b.ok());
  CHECK(b.error().code() == errc::invalid_argument);
}

#endif  // CCLITE_HAS_NCCL
