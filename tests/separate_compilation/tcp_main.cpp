// A separately compiled program (CCLITE_SEPARATE_COMPILATION) whose
// communicator is not cclite::default_communicator: communicator<tcp::transport>
// in a build that has shm too. This TU declares it compiled elsewhere with
// CCLITE_EXTERN_COMMUNICATOR; tcp_src.cpp compiles it with
// CCLITE_INSTANTIATE_COMMUNICATOR. tests/separate_compilation.cmake checks the
// objects and runs it (the line it prints is hello_allreduce's).
#include <cclite/cclite.hpp>

#include <cstdio>
#include <vector>

CCLITE_EXTERN_COMMUNICATOR(cclite::tcp::transport)

using tcp_comm = cclite::communicator<cclite::tcp::transport>;

int main() {
  auto comm = cclite::init_communicator<tcp_comm>();
  if (!comm) {
    std::fprintf(stderr, "%s\n", comm.error().to_string().c_str());
    return 1;
  }
  auto& c = *comm.value();
  std::vector<float> v(1 << 16, static_cast<float>(c.rank()));
  if (auto st = c.allreduce(v.data(), v.size()); !st.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", c.rank(), st.to_string().c_str());
    return 1;
  }
  const float want = c.size() * (c.size() - 1) / 2.0f;
  const bool ok = v[0] == want && v.back() == want;
  std::printf("rank %d of %d (local %d, node %s via %s): sum of ranks = %g (%s)\n", c.rank(), c.size(),
              c.local_rank(), c.peer(c.rank()).hostname.c_str(),
              c.size() > 1 ? c.transport_of(c.topo().ring_next(c.rank())) : "self", v[0], ok ? "correct" : "WRONG");
  return ok ? 0 : 1;
}
