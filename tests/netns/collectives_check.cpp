// collectives_check: every collective once or twice, with results checked,
// under whatever launcher started it (cclite-run on simulated nodes in
// tests/netns/, mpirun in tests/netns/mpirun_test.sh).
//
//   collectives_check [--count N] [--repeat K]
//     N: elements of the large calls (default 1 Mi); K: then K more large
//     allreduces, printing "iteration 1" after the first (a job that is
//     still running when a test kills a node).
//   collectives_check --abort-rank0
//     rank 0 aborts its communicator, makes one call (which records the
//     failure in the store it hosts) and returns at once, exit 3; the others
//     call allreduce 0.5 s later and print what it returned, exit 1 (the
//     store host must stay until they have read the failure: launch_e2e_test).
//   collectives_check --late-p2p
//     (4 ranks or more) after init (which connects ring neighbours only),
//     prints "ready", waits 4 s, then exchanges 1000 floats with rank
//     (r + 2) % size, a first connection: a test loses a node in those 4 s.
//   collectives_check --stuck-rank1
//     (3 ranks or more) one allreduce; then rank 1 "computes" for 60 s, the
//     last rank exits with status 2 after 1 s, the others wait in a second
//     allreduce: a job whose ranks did not fail in cclite (launch_e2e_test:
//     cclite-run asks them for their flight recorder files).
//
// Values are small integers, exact in float, so every check is equality.
// Prints one line per rank ("collectives_check: rank R of S on HOST: 14 checks
// passed"), or the failed call and exits 1. The peers' transports are in the
// CCLITE_DEBUG=INFO log ("peer ...: via shm|tcp"), which the tests grep.
#include <cclite/cclite.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

int failures = 0;
int passed = 0;

void expect(bool ok, int rank, const char* what) {
  if (ok) {
    ++passed;
  } else {
    ++failures;
    std::fprintf(stderr, "collectives_check: rank %d: %s: WRONG result\n", rank, what);
  }
}

bool call(const cclite::status& st, int rank, const char* what) {
  if (st.ok()) return true;
  std::fprintf(stderr, "collectives_check: rank %d: %s failed: %s\n", rank, what, st.to_string().c_str());
  std::exit(1);  // a failed call leaves the communicator unusable
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t big = std::size_t(1) << 20;
  long repeat = 0;
  bool abort_rank0 = false, stuck_rank1 = false, late_p2p = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--abort-rank0") == 0) abort_rank0 = true;
    if (std::strcmp(argv[i], "--late-p2p") == 0) late_p2p = true;
    if (std::strcmp(argv[i], "--stuck-rank1") == 0) stuck_rank1 = true;
  }
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--count") == 0) big = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--repeat") == 0) repeat = std::strtol(argv[i + 1], nullptr, 10);
  }

  auto made = cclite::init();
  if (!made) {
    std::fprintf(stderr, "collectives_check: %s\n", made.error().to_string().c_str());
    return 1;
  }
  auto& c = *made.value();
  const int r = c.rank(), n = c.size();
  if (abort_rank0) {
    std::vector<float> x(1000, 1.0f);
    if (r == 0) c.abort();
    else std::this_thread::sleep_for(std::chrono::milliseconds(500));  // rank 0 has failed and left by then
    const cclite::status st = c.allreduce(x.data(), x.size());
    std::fprintf(stderr, "collectives_check: rank %d: %s\n", r, st.to_string().c_str());
    return r == 0 ? 3 : st.ok() ? 0 : 1;
  }
  if (late_p2p) {
    std::printf("collectives_check: rank %d: ready\n", r);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(4));
    std::vector<float> mine(1000, float(r)), theirs(1000, -1.0f);
    const int partner = (r + 2) % n;
    call(c.sendrecv(mine.data(), mine.size(), partner, theirs.data(), theirs.size(), partner,
                    cclite::dtype::float32),
         r, "sendrecv");
    expect(theirs[999] == float(partner), r, "sendrecv from r + 2");
    std::printf("collectives_check: rank %d: sendrecv with rank %d passed\n", r, partner);
    return failures ? 1 : 0;
  }
  if (stuck_rank1) {
    std::vector<float> x(1000, 1.0f);
    call(c.allreduce(x.data(), x.size()), r, "allreduce #1");
    if (r == 1) std::this_thread::sleep_for(std::chrono::seconds(60));
    if (r == n - 1) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      return 2;
    }
    const cclite::status st = c.allreduce(x.data(), x.size());
    std::fprintf(stderr, "collectives_check: rank %d: %s\n", r, st.to_string().c_str());
    return 1;
  }
  using cclite::dtype;
  using cclite::reduce_op;
  const double tri = n * (n + 1) / 2.0;  // 1 + 2 + ... + n

  // allreduce, small (latency algorithms) and large (bandwidth / hierarchical).
  for (std::size_t count : {std::size_t(5), big}) {
    std::vector<float> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = float((r + 1) * (i % 7 + 1));
    call(c.allreduce(v.data(), count), r, "allreduce sum float");
    bool ok = true;
    for (std::size_t i = 0; i < count; ++i) ok = ok && v[i] == float(tri * (i % 7 + 1));
    expect(ok, r, count == 5 ? "allreduce sum float (5)" : "allreduce sum float (large)");
  }
  {
    std::vector<std::int32_t> v(1000, r * 3), out(1000);
    call(c.allreduce(v.data(), out.data(), v.size(), dtype::int32, reduce_op::max), r, "allreduce max");
    bool ok = true;
    for (auto x : out) ok = ok && x == (n - 1) * 3;
    expect(ok, r, "allreduce max int32");
  }
  // broadcast from the last rank (not 0: a root on another node).
  {
    const int root = n - 1;
    std::vector<double> v(big / 4, 0.0);
    if (r == root)
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = double(i % 13 + root);
    call(c.broadcast(v.data(), v.size(), dtype::float64, root), r, "broadcast");
    bool ok = true;
    for (std::size_t i = 0; i < v.size(); ++i) ok = ok && v[i] == double(i % 13 + root);
    expect(ok, r, "broadcast float64");
  }
  // reduce to rank 0.
  {
    std::vector<std::int32_t> v(4096, r + 1), out(4096, -1);
    call(c.reduce(v.data(), out.data(), v.size(), dtype::int32, reduce_op::sum, 0), r, "reduce");
    bool ok = true;
    if (r == 0)
      for (auto x : out) ok = ok && x == std::int32_t(tri);
    expect(ok, r, "reduce sum int32 to 0");
  }
  // allgather and allgatherv.
  {
    const std::size_t k = 3000;
    std::vector<std::int32_t> mine(k), all(k * n);
    for (std::size_t i = 0; i < k; ++i) mine[i] = r * 100000 + std::int32_t(i);
    call(c.allgather(mine.data(), all.data(), k, dtype::int32), r, "allgather");
    bool ok = true;
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < k; ++i) ok = ok && all[p * k + i] == p * 100000 + std::int32_t(i);
    expect(ok, r, "allgather int32");

    std::vector<std::size_t> counts(n), displs(n);
    std::size_t total = 0;
    for (int p = 0; p < n; ++p) {
      counts[p] = std::size_t(p + 1) * 17;
      displs[p] = total;
      total += counts[p];
    }
    std::vector<std::int32_t> vmine(counts[r], r), vall(total, -1);
    call(c.allgatherv(vmine.data(), counts[r], vall.data(), counts.data(), displs.data(), dtype::int32), r,
         "allgatherv");
    ok = true;
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < counts[p]; ++i) ok = ok && vall[displs[p] + i] == p;
    expect(ok, r, "allgatherv int32");
  }
  // reduce_scatter: block b of rank p's input holds p + b*k + i.
  {
    const std::size_t k = big / 8 + 1;
    std::vector<float> in(k * n), out(k);
    for (int b = 0; b < n; ++b)
      for (std::size_t i = 0; i < k; ++i) in[b * k + i] = float(r + (i % 1000));
    call(c.reduce_scatter(in.data(), out.data(), k, dtype::float32, reduce_op::sum), r, "reduce_scatter");
    bool ok = true;
    for (std::size_t i = 0; i < k; ++i) ok = ok && out[i] == float(n * (n - 1) / 2 + n * (i % 1000));
    expect(ok, r, "reduce_scatter sum float");
  }
  // alltoall and alltoallv.
  {
    const std::size_t k = 2000;
    std::vector<std::int32_t> in(k * n), out(k * n);
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < k; ++i) in[p * k + i] = r * 1000000 + p * 1000 + std::int32_t(i % 1000);
    call(c.alltoall(in.data(), out.data(), k, dtype::int32), r, "alltoall");
    bool ok = true;
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < k; ++i) ok = ok && out[p * k + i] == p * 1000000 + r * 1000 + std::int32_t(i % 1000);
    expect(ok, r, "alltoall int32");

    // rank a sends (a + b) % 3 + 1 elements to rank b: symmetric, so recv counts match.
    std::vector<std::size_t> cnt(n), dsp(n);
    std::size_t tot = 0;
    for (int p = 0; p < n; ++p) {
      cnt[p] = std::size_t((r + p) % 3 + 1);
      dsp[p] = tot;
      tot += cnt[p];
    }
    std::vector<std::int32_t> vin(tot), vout(tot, -1);
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < cnt[p]; ++i) vin[dsp[p] + i] = r * 100 + p;
    call(c.alltoallv(vin.data(), cnt.data(), dsp.data(), vout.data(), cnt.data(), dsp.data(), dtype::int32), r,
         "alltoallv");
    ok = true;
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < cnt[p]; ++i) ok = ok && vout[dsp[p] + i] == p * 100 + r;
    expect(ok, r, "alltoallv int32");
  }
  // gather to and scatter from rank 1 % n.
  {
    const int root = 1 % n;
    const std::size_t k = 500;
    std::vector<std::int32_t> mine(k, r * 7), all(k * n, -1);
    call(c.gather(mine.data(), all.data(), k, dtype::int32, root), r, "gather");
    bool ok = true;
    if (r == root)
      for (int p = 0; p < n; ++p)
        for (std::size_t i = 0; i < k; ++i) ok = ok && all[p * k + i] == p * 7;
    expect(ok, r, "gather int32");

    std::vector<std::int32_t> src(k * n), part(k, -1);
    if (r == root)
      for (int p = 0; p < n; ++p)
        for (std::size_t i = 0; i < k; ++i) src[p * k + i] = p * 11 + std::int32_t(i);
    call(c.scatter(src.data(), part.data(), k, dtype::int32, root), r, "scatter");
    ok = true;
    for (std::size_t i = 0; i < k; ++i) ok = ok && part[i] == r * 11 + std::int32_t(i);
    expect(ok, r, "scatter int32");
  }
  // gatherv to and scatterv from rank n - 1, and reduce_scatterv: counts that differ per
  // rank (rank 0's empty), across the nodes.
  {
    const int root = n - 1;
    std::vector<std::size_t> cnt(n), dsp(n);
    std::size_t tot = 0;
    for (int p = 0; p < n; ++p) {
      cnt[p] = std::size_t(p) * 1500;
      dsp[p] = tot;
      tot += cnt[p];
    }
    std::vector<std::int32_t> mine(cnt[r]), all(tot, -1), back(cnt[r], -1);
    for (std::size_t i = 0; i < cnt[r]; ++i) mine[i] = r * 100000 + std::int32_t(i);
    call(c.gatherv(mine.data(), cnt[r], all.data(), cnt.data(), dsp.data(), dtype::int32, root), r, "gatherv");
    bool ok = true;
    if (r == root)
      for (int p = 0; p < n; ++p)
        for (std::size_t i = 0; i < cnt[p]; ++i) ok = ok && all[dsp[p] + i] == p * 100000 + std::int32_t(i);
    expect(ok, r, "gatherv int32");
    call(c.scatterv(all.data(), cnt.data(), dsp.data(), back.data(), cnt[r], dtype::int32, root), r, "scatterv");
    expect(back == mine, r, "scatterv int32");

    std::vector<float> in(tot), out(cnt[r], -1.0f);
    for (std::size_t i = 0; i < tot; ++i) in[i] = float(r + (i % 1000));
    call(c.reduce_scatterv(in.data(), out.data(), cnt.data(), dtype::float32, reduce_op::sum), r, "reduce_scatterv");
    ok = true;
    for (std::size_t i = 0; i < cnt[r]; ++i) ok = ok && out[i] == float(n * (n - 1) / 2 + n * ((dsp[r] + i) % 1000));
    expect(ok, r, "reduce_scatterv sum float");
  }
  // scan and exscan (sum, int64): rank r ends with the ranks 0..r (0..r-1) summed, across
  // the nodes: 5 elements by recursive doubling (3 or more ranks), big / 8 along the chain.
  for (const std::size_t k : {std::size_t(5), big / 8}) {
    std::vector<std::int64_t> x(k), inc(k, -1), exc(k, -1);
    for (std::size_t i = 0; i < k; ++i) x[i] = std::int64_t(r + 1) * 1000 + std::int64_t(i % 97);
    call(c.scan(x.data(), inc.data(), k, dtype::int64, reduce_op::sum), r, "scan");
    call(c.exscan(x.data(), exc.data(), k, dtype::int64, reduce_op::sum), r, "exscan");
    bool ok = true;
    for (std::size_t i = 0; i < k; ++i) {
      const std::int64_t below = std::int64_t(r) * (r + 1) / 2 * 1000 + std::int64_t(r) * std::int64_t(i % 97);
      ok = ok && inc[i] == below + x[i] && exc[i] == (r == 0 ? -1 : below);
    }
    expect(ok, r, "scan / exscan sum int64");
  }
  // sendrecv around the ring, then send/recv between pairs (0,1), (2,3), ...
  {
    const std::size_t k = big / 4;
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    std::vector<std::int32_t> out(k, r), in(k, -1);
    call(c.sendrecv(out.data(), k, next, in.data(), k, prev, dtype::int32), r, "sendrecv");
    bool ok = true;
    for (auto x : in) ok = ok && x == prev;
    expect(ok, r, "sendrecv ring int32");

    int partner = (r % 2 == 0) ? r + 1 : r - 1;
    ok = true;
    if (partner < n) {
      std::vector<std::int32_t> buf(k, r);
      if (r % 2 == 0) {
        call(c.send(buf.data(), k, dtype::int32, partner), r, "send");
      } else {
        call(c.recv(buf.data(), k, dtype::int32, partner), r, "recv");
        for (auto x : buf) ok = ok && x == partner;
      }
    }
    expect(ok, r, "send/recv pairs int32");
  }
  call(c.barrier(), r, "barrier");
  ++passed;
  for (long it = 1; it <= repeat; ++it) {
    std::vector<float> v(big, 1.0f);
    call(c.allreduce(v.data(), v.size()), r, "allreduce (repeat)");
    if (it == 1) {
      std::printf("collectives_check: rank %d: iteration 1\n", r);
      std::fflush(stdout);
    }
  }

  if (failures) {
    std::fprintf(stderr, "collectives_check: rank %d of %d: %d checks FAILED\n", r, n, failures);
    return 1;
  }
  std::printf("collectives_check: rank %d of %d on %s: %d checks passed\n", r, n,
              c.peer(r).hostname.c_str(), passed);
  return 0;
}
