// hello_allreduce: the shortest useful cclite program.
//
//   build/bin/cclite-run --nproc-per-node 4 build/bin/hello_allreduce
//
// Every rank contributes its rank number; after the allreduce every rank holds
// 0 + 1 + ... + (n-1). Works the same under torchrun --no-python, mpirun and srun.
#include <cclite/cclite.hpp>  // provides: cclite::init, communicator, allreduce

#include <cstdio>
#include <vector>

int main() {
  auto comm = cclite::init();  // rank, size and rendezvous from the launcher's environment
  if (!comm) {
    std::fprintf(stderr, "%s\n", comm.error().to_string().c_str());
    return 1;
  }
  auto& c = *comm.value();

  std::vector<float> v(1 << 20, static_cast<float>(c.rank()));
  if (auto st = c.allreduce(v.data(), v.size()); !st.ok()) {  // in place, sum
    std::fprintf(stderr, "rank %d: %s\n", c.rank(), st.to_string().c_str());
    return 1;
  }

  const float want = c.size() * (c.size() - 1) / 2.0f;
  std::printf("rank %d of %d (local %d, node %s via %s): sum of ranks = %g (%s)\n", c.rank(),
              c.size(), c.local_rank(), c.peer(c.rank()).hostname.c_str(),
              c.size() > 1 ? c.transport_of(c.topo().ring_next(c.rank())) : "self", v[0],
              v[0] == want && v.back() == want ? "correct" : "WRONG");
  return v[0] == want && v.back() == want ? 0 : 1;
}
