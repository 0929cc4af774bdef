// A one-rank cclite program; tests/consumer/find_package builds it against an
// installed cclite, tests/consumer/add_subdirectory inside its own tree.
// CCLITE_CONSUMER_HOW names the way ("find_package" / "add_subdirectory").
// Run with CCLITE_RANK=0 CCLITE_WORLD_SIZE=1: a job of one needs no rendezvous.
// Exits 0 when the allreduce returns the input unchanged (the sum over one rank).
#include <cclite/cclite.hpp>

#include <cstdio>
#include <vector>

// The umbrella target must carry the definitions of each component that exists
// (CMakeLists.txt defines CONSUMER_WANT_<NAME> for each cclite::<name> target).
#if defined(CONSUMER_WANT_SHM) != defined(CCLITE_HAS_SHM)
#error "CCLITE_HAS_SHM does not match whether cclite::shm exists"
#endif
#if defined(CONSUMER_WANT_TCP) != defined(CCLITE_HAS_TCP)
#error "CCLITE_HAS_TCP does not match whether cclite::tcp exists"
#endif

int main() {
  auto comm = cclite::init();
  if (!comm) {
    std::fprintf(stderr, "cclite::init: %s\n", comm.error().to_string().c_str());
    return 1;
  }
  auto& c = *comm.value();
  if (c.rank() != 0 || c.size() != 1) {
    std::fprintf(stderr, "expected rank 0 of 1, got rank %d of %d\n", c.rank(), c.size());
    return 1;
  }

  std::vector<float> v(4096);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  if (auto st = c.allreduce(v.data(), v.size()); !st.ok()) {
    std::fprintf(stderr, "allreduce: %s\n", st.to_string().c_str());
    return 1;
  }
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] != static_cast<float>(i)) {
      std::fprintf(stderr, "allreduce: v[%zu] = %g, want %zu\n", i, static_cast<double>(v[i]), i);
      return 1;
    }
  }

  const char* transports = "shm+tcp";
#if !defined(CCLITE_HAS_TCP)
  transports = "shm";
#elif !defined(CCLITE_HAS_SHM)
  transports = "tcp";
#endif
  std::printf("cclite consumer (" CCLITE_CONSUMER_HOW ", %s): allreduce of %zu floats, rank 0 of 1: ok\n", transports,
              v.size());
  return 0;
}
