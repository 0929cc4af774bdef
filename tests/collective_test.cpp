// Multi-process broadcast, barrier, async calls, argument errors, abort and
// deadlines of the communicator, over real shm and loopback TCP.
#include <cclite/cclite.hpp>

#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include "support/comm.hpp"
#include "support/mp.hpp"

using namespace cclite;
using cclite::test::net;

namespace {

void run(int size, net n, const std::function<int(default_communicator&, store&)>& body,
         std::chrono::seconds limit = std::chrono::seconds(120), comm_options opts = {}) {
  test::temp_dir dir;
  auto r = test::run_ranks(
      size,
      [&](int rank, int sz) {
        auto kv = test::open_dir_store(dir.path);
        auto c = test::make_comm(*kv, rank, sz, opts);
        return body(*c, *kv);
      },
      limit, [&](int rank) { test::set_net_env(n, rank, size); });
  INFO("size ", size, " net ", test::to_string(n), ": ", r.describe());
  CHECK(r.all_ok());
}

int broadcast_all_roots(default_communicator& c, store&) {
  for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(1009), std::size_t(3u << 20)}) {
    for (int root = 0; root < c.size(); ++root) {
      std::vector<std::uint32_t> buf(count);
      for (std::size_t i = 0; i < count; ++i)
        buf[i] = c.rank() == root ? static_cast<std::uint32_t>(i * 2654435761u + root) : 0xdeadbeef;
      MP_REQUIRE_OK(c.broadcast(buf.data(), count, root));
      for (std::size_t i = 0; i < count; ++i) {
        if (buf[i] != static_cast<std::uint32_t>(i * 2654435761u + root)) {
          std::fprintf(stderr, "rank %d: broadcast root %d count %zu: element %zu wrong\n", c.rank(),
                       root, count, i);
          return 1;
        }
      }
    }
  }
  return 0;
}

}  // namespace

TEST_CASE("broadcast: every root, shm / tcp / mixed") {
  run(3, net::shm_only, broadcast_all_roots);
  run(4, net::tcp_only, broadcast_all_roots);
  run(5, net::mixed, broadcast_all_roots);
}

TEST_CASE("barrier: nobody leaves before everyone arrived") {
  run(4, net::mixed, [](default_communicator& c, store& kv) {
    for (int round = 0; round < 3; ++round) {
      // Ranks arrive staggered; after the barrier every arrival must be visible.
      std::this_thread::sleep_for(std::chrono::milliseconds(30 * c.rank()));
      MP_REQUIRE_OK(kv.set("arrived/" + std::to_string(round) + "/" + std::to_string(c.rank()), "1"));
      MP_REQUIRE_OK(c.barrier());
      for (int r = 0; r < c.size(); ++r) {
        auto has = kv.check("arrived/" + std::to_string(round) + "/" + std::to_string(r));
        MP_REQUIRE_OK(has);
        MP_CHECK(has.value());
      }
    }
    return 0;
  });
}

TEST_CASE("async: several allreduces in flight, then blocking calls, in order") {
  run(3, net::shm_only, [](default_communicator& c, store&) {
    const std::size_t n = 100000;
    std::vector<std::vector<float>> bufs(8, std::vector<float>(n));
    std::vector<work> ws;
    for (std::size_t k = 0; k < bufs.size(); ++k) {
      for (std::size_t i = 0; i < n; ++i) bufs[k][i] = static_cast<float>(k + c.rank());
      ws.push_back(c.allreduce_async(bufs[k].data(), n));
    }
    std::vector<int> tail(10, c.rank());
    MP_REQUIRE_OK(c.allreduce(tail.data(), tail.size()));  // queued behind the async ones
    for (auto& w : ws) MP_REQUIRE_OK(w.wait(std::chrono::seconds(60)));
    for (std::size_t k = 0; k < bufs.size(); ++k)
      MP_CHECK(bufs[k][n - 1] == static_cast<float>(3 * k + 3));
    MP_CHECK(tail[0] == 3);
    return 0;
  });
}

namespace {
// Every *_async form the communicator has besides allreduce, issued back to
// back before any is waited for; a blocking call queued behind them; then
// every result checked. The point-to-point ones form a chain 0 -> 1 -> ... ->
// 0 (each rank's receive comes before its send, except rank 0's) with
// messages larger than any link buffer, so a call that ran out of issue
// order, or a send that returned before its peer received, would show.
int every_async_form(default_communicator& c, store&) {
  const int n = c.size(), r = c.rank();
  const std::size_t count = 1000, big = 3u << 20;
  auto val = [](int from, int to, std::size_t i) { return static_cast<std::int32_t>(from * 1000003 + to * 1009 + i); };

  std::vector<std::int32_t> gsend(count), grecv(r == 1 ? count * n : 0);
  for (std::size_t i = 0; i < count; ++i) gsend[i] = val(r, 1, i);
  std::vector<std::int32_t> ssend(r == n - 1 ? count * n : 0), srecv(count);
  for (int to = 0; to < n && r == n - 1; ++to)
    for (std::size_t i = 0; i < count; ++i) ssend[to * count + i] = val(n - 1, to, i);
  // allgatherv: rank q contributes q + 1 elements at displs[q] (gaps between blocks).
  std::vector<std::size_t> vcounts(n), vdispls(n);
  for (int q = 0; q < n; ++q) vcounts[q] = q + 1, vdispls[q] = q == 0 ? 0 : vdispls[q - 1] + vcounts[q - 1] + 2;
  std::vector<std::int32_t> vsend(vcounts[r]), vrecv(vdispls[n - 1] + vcounts[n - 1], -1);
  for (std::size_t i = 0; i < vsend.size(); ++i) vsend[i] = val(r, -1, i);
  // alltoallv: r sends r + to + 1 elements to `to`.
  std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
  for (int q = 0; q < n; ++q) {
    sc[q] = r + q + 1, rc[q] = q + r + 1;
    sd[q] = q == 0 ? 0 : sd[q - 1] + sc[q - 1];
    rd[q] = q == 0 ? 0 : rd[q - 1] + rc[q - 1];
  }
  std::vector<std::int32_t> asend(sd[n - 1] + sc[n - 1]), arecv(rd[n - 1] + rc[n - 1]);
  for (int q = 0; q < n; ++q)
    for (std::size_t i = 0; i < sc[q]; ++i) asend[sd[q] + i] = val(r, q, i);
  // sendrecv ring shift and the send / recv chain, both past the link buffers.
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<std::int32_t> xsend(big), xrecv(big), psend(big), precv(big);
  for (std::size_t i = 0; i < big; ++i) xsend[i] = val(r, next, i), psend[i] = val(r, next, i + 7);

  std::vector<work> ws;
  ws.push_back(c.gather_async(gsend.data(), grecv.data(), count, dtype::int32, 1));
  ws.push_back(c.scatter_async(ssend.data(), srecv.data(), count, dtype::int32, n - 1));
  ws.push_back(c.allgatherv_async(vsend.data(), vsend.size(), vrecv.data(), vcounts.data(), vdispls.data(),
                                  dtype::int32));
  ws.push_back(c.alltoallv_async(asend.data(), sc.data(), sd.data(), arecv.data(), rc.data(), rd.data(),
                                 dtype::int32));
  ws.push_back(c.sendrecv_async(xsend.data(), big, next, xrecv.data(), big, prev, dtype::int32));
  if (r == 0) {
    ws.push_back(c.send_async(psend.data(), big, dtype::int32, next));
    ws.push_back(c.recv_async(precv.data(), big, dtype::int32, prev));
  } else {
    ws.push_back(c.recv_async(precv.data(), big, dtype::int32, prev));
    ws.push_back(c.send_async(psend.data(), big, dtype::int32, next));
  }
  std::int32_t tail = 1;
  MP_REQUIRE_OK(c.allreduce(&tail, 1));  // runs after all of the above
  MP_CHECK(tail == n);
  for (auto& w : ws) MP_CHECK(w.done());  // the blocking call waited for them
  for (auto& w : ws) MP_REQUIRE_OK(w.wait(std::chrono::seconds(60)));

  int wrong = 0;
  auto expect = [&](const char* what, std::int32_t got, std::int32_t want) {
    if (got != want && wrong++ < 5) std::fprintf(stderr, "rank %d: %s: got %d, want %d\n", r, what, got, want);
  };
  for (int q = 0; q < n && r == 1; ++q)
    for (std::size_t i = 0; i < count; ++i) expect("gather", grecv[q * count + i], val(q, 1, i));
  for (std::size_t i = 0; i < count; ++i) expect("scatter", srecv[i], val(n - 1, r, i));
  for (int q = 0; q < n; ++q) {
    for (std::size_t i = 0; i < vcounts[q]; ++i) expect("allgatherv", vrecv[vdispls[q] + i], val(q, -1, i));
    if (q + 1 < n) expect("allgatherv gap", vrecv[vdispls[q] + vcounts[q]], -1);
    for (std::size_t i = 0; i < rc[q]; ++i) expect("alltoallv", arecv[rd[q] + i], val(q, r, i));
  }
  for (std::size_t i = 0; i < big; ++i) {
    expect("sendrecv", xrecv[i], val(prev, r, i));
    expect("recv", precv[i], val(prev, r, i + 7));
  }
  return wrong ? 1 : 0;
}
}  // namespace

TEST_CASE("async: every call has an async form, run in issue order, shm / tcp / mixed") {
  run(3, net::shm_only, every_async_form);
  run(2, net::tcp_only, every_async_form);
  run(4, net::mixed, every_async_form);
}

namespace {
// Groups of point-to-point calls (group_start / group_end). Each part would
// deadlock, or deliver to the wrong buffer, if the group ran its calls one by
// one in issue order or lost the per-peer order:
//  1. a ring shift larger than the link buffers, every rank's send first;
//  2. a hand-written all-to-all with a different size per pair (odd byte
//     counts, so each transfer is padded), two transfers per pair in one
//     direction (their order must hold), the receives issued in reverse peer
//     order, and the send to itself;
//  3. nesting: the inner group_end() runs nothing;
//  4. a grouped send meets a lone recv;
//  5. misuse fails on the calling rank and leaves the group and the
//     communicator usable;
//  6. collectives in a group (NCCL style) are recorded and run at
//     group_end(), before the transfers; a grouped one meets a lone one.
int p2p_groups(default_communicator& c, store&) {
  const int n = c.size(), r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  auto val = [](int from, int to, std::size_t i) { return static_cast<std::uint8_t>(from * 31 + to * 7 + i * 13); };
  int wrong = 0;
  auto expect = [&](const char* what, int peer, std::size_t i, unsigned got, unsigned want) {
    if (got != want && wrong++ < 5)
      std::fprintf(stderr, "rank %d: %s (peer %d) byte %zu: got %u, want %u\n", r, what, peer, i, got, want);
  };

  // 1. ring shift, 12 MiB + 5 bytes: more than a link buffer (4 MiB) holds.
  const std::size_t big = (12u << 20) + 5;
  std::vector<std::uint8_t> out(big), in(big, 0);
  for (std::size_t i = 0; i < big; ++i) out[i] = val(r, next, i);
  c.group_start();
  MP_REQUIRE_OK(c.send(out.data(), big, dtype::uint8, next));
  MP_REQUIRE_OK(c.recv(in.data(), big, dtype::uint8, prev));
  MP_CHECK(in[0] == 0 && in[big - 1] == 0);  // recorded, not run
  MP_REQUIRE_OK(c.group_end());
  for (std::size_t i = 0; i < big; ++i) expect("ring shift", prev, i, in[i], val(prev, r, i));

  // 2. all-to-all: r sends `a(r, q)` then `b` bytes to q; receives in reverse order.
  // Both messages span several 64 KiB pieces: the second must not start on the
  // link before the first is through.
  auto a = [&](int from, int to) { return std::size_t(100000) * (from + 1) + 77 * to + (to == from ? 3 : 1); };
  const std::size_t b = 600000;  // the second message, past a tcp buffer
  std::vector<std::vector<std::uint8_t>> sa(n), sb(n), ra(n), rb(n);
  c.group_start();
  for (int q = 0; q < n; ++q) {
    sa[q].resize(a(r, q));
    sb[q].resize(b);
    for (std::size_t i = 0; i < sa[q].size(); ++i) sa[q][i] = val(r, q, i);
    for (std::size_t i = 0; i < b; ++i) sb[q][i] = val(r, q, i + 5);
    MP_REQUIRE_OK(c.send(sa[q].data(), sa[q].size(), dtype::uint8, q));
    MP_REQUIRE_OK(c.send(sb[q].data(), b, dtype::uint8, q));
  }
  for (int q = n - 1; q >= 0; --q) {
    ra[q].assign(a(q, r), 0);
    rb[q].assign(b, 0);
    MP_REQUIRE_OK(c.recv(ra[q].data(), ra[q].size(), dtype::uint8, q));
    MP_REQUIRE_OK(c.recv(rb[q].data(), b, dtype::uint8, q));
  }
  MP_REQUIRE_OK(c.group_end());
  for (int q = 0; q < n; ++q) {
    for (std::size_t i = 0; i < ra[q].size(); ++i) expect("all-to-all first", q, i, ra[q][i], val(q, r, i));
    for (std::size_t i = 0; i < b; ++i) expect("all-to-all second", q, i, rb[q][i], val(q, r, i + 5));
  }

  // 3. nested: the inner group_end() runs nothing; sendrecv inside.
  std::vector<std::int32_t> x(1000, r), y(1000, -1);
  c.group_start();
  c.group_start();
  MP_REQUIRE_OK(c.sendrecv(x.data(), x.size(), next, y.data(), y.size(), prev, dtype::int32));
  MP_REQUIRE_OK(c.group_end());
  MP_CHECK(y[0] == -1);
  MP_REQUIRE_OK(c.group_end());
  MP_CHECK(y[0] == prev && y[999] == prev);

  // 4. a grouped send to the next rank, a lone recv from the previous one
  // (rank 0 receives first: a lone send would have nobody receiving).
  std::vector<float> f(5000, static_cast<float>(r) + 0.5f), g(5000, 0.0f);
  if (r == 0) MP_REQUIRE_OK(c.recv(g.data(), g.size(), dtype::float32, prev));
  c.group_start();
  MP_REQUIRE_OK(c.send(f.data(), f.size(), dtype::float32, next));
  MP_REQUIRE_OK(c.group_end());
  if (r != 0) MP_REQUIRE_OK(c.recv(g.data(), g.size(), dtype::float32, prev));
  MP_CHECK(g[0] == static_cast<float>(prev) + 0.5f && g[4999] == g[0]);

  // 5. misuse.
  MP_CHECK(c.group_end().code() == errc::invalid_argument);  // none open
  c.group_start();
  MP_REQUIRE_OK(c.group_end());  // empty
  std::int32_t one = 1, got = 0;
  c.group_start();
  auto child = c.split(0, r);
  MP_CHECK(!child && child.error().code() == errc::invalid_argument);
  MP_CHECK(c.allreduce(static_cast<const void*>(nullptr), &got, 1, dtype::int32, reduce_op::sum).code() ==
           errc::invalid_argument);  // checked when issued, not recorded
  work w = c.send_async(&one, 1, dtype::int32, next);
  MP_CHECK(w.wait(std::chrono::seconds(1)).code() == errc::invalid_argument);
  MP_CHECK(c.send(&one, 1, dtype::int32, n + 3).code() == errc::invalid_argument);  // not recorded
  MP_REQUIRE_OK(c.send(&one, 1, dtype::int32, next));
  MP_REQUIRE_OK(c.recv(&got, 1, dtype::int32, prev));
  MP_REQUIRE_OK(c.group_end());
  MP_CHECK(got == 1);
  c.group_start();
  MP_REQUIRE_OK(c.send(&one, 1, dtype::int32, r));  // to itself, with no receive from itself
  MP_CHECK(c.group_end().code() == errc::invalid_argument);
  MP_REQUIRE_OK(c.allreduce(&one, 1));
  MP_CHECK(one == n);
  // A receive overlapping another transfer of its group (on every rank): refused
  // before anything runs, the grouped collective included; the communicator
  // stays usable. Sends may share a buffer.
  std::int32_t pair[4] = {r, r, r, r}, got4[4] = {-1, -1, -1, -1};
  c.group_start();
  MP_REQUIRE_OK(c.allreduce(&one, 1));
  MP_REQUIRE_OK(c.send(pair, 2, dtype::int32, next));
  MP_REQUIRE_OK(c.recv(pair + 1, 2, dtype::int32, prev));
  status st = c.group_end();
  MP_CHECK(st.code() == errc::invalid_argument);
  MP_CHECK(st.message().find("transfer 2, a receive from rank " + std::to_string(prev)) != std::string::npos);
  MP_CHECK(st.message().find("overlaps that of transfer 1, a send to rank " + std::to_string(next)) != std::string::npos);
  MP_CHECK(one == n && pair[2] == r);  // nothing ran
  c.group_start();
  MP_REQUIRE_OK(c.recv(got4, 3, dtype::int32, prev));
  MP_REQUIRE_OK(c.recv(got4 + 2, 2, dtype::int32, next));
  MP_CHECK(c.group_end().code() == errc::invalid_argument);  // two receives
  c.group_start();
  MP_REQUIRE_OK(c.send(pair, 2, dtype::int32, next));
  MP_REQUIRE_OK(c.send(pair, 2, dtype::int32, prev));
  MP_REQUIRE_OK(c.recv(got4, 2, dtype::int32, prev));
  MP_REQUIRE_OK(c.recv(got4 + 2, 2, dtype::int32, next));
  MP_REQUIRE_OK(c.group_end());
  MP_CHECK(got4[0] == prev && got4[1] == prev && got4[2] == next && got4[3] == next);

  // 6. collectives in a group, between transfers; two allreduce sizes (the
  // small path and the ring), a broadcast, a barrier.
  std::vector<float> s1(3000, static_cast<float>(r + 1)), s2(70000, 2.0f * static_cast<float>(r));
  const int root = 1 % n;
  std::vector<std::int64_t> bc(100, r == root ? 42 : -1);
  std::vector<std::int32_t> ring_out(10, r), ring_in(10, -1);
  c.group_start();
  MP_REQUIRE_OK(c.allreduce(s1.data(), s1.data(), s1.size()));
  MP_REQUIRE_OK(c.send(ring_out.data(), ring_out.size(), dtype::int32, next));
  MP_REQUIRE_OK(c.broadcast(bc.data(), bc.size(), dtype::int64, root));
  MP_REQUIRE_OK(c.recv(ring_in.data(), ring_in.size(), dtype::int32, prev));
  MP_REQUIRE_OK(c.barrier());
  MP_REQUIRE_OK(c.allreduce(s2.data(), s2.data(), s2.size(), reduce_op::max));
  MP_CHECK(s1[0] == static_cast<float>(r + 1) && ring_in[0] == -1 && bc[0] == (r == root ? 42 : -1));  // recorded
  MP_REQUIRE_OK(c.group_end());
  const float sum = static_cast<float>(n * (n + 1) / 2), top = 2.0f * static_cast<float>(n - 1);
  for (float x : s1) wrong += x != sum;
  for (float x : s2) wrong += x != top;
  for (std::int64_t x : bc) wrong += x != 42;
  for (std::int32_t x : ring_in) wrong += x != prev;
  // Grouped on even ranks, lone on odd ones: the same sequence of collectives.
  std::int32_t v = r;
  if (r % 2 == 0) c.group_start();
  MP_REQUIRE_OK(c.allreduce(&v, 1, reduce_op::max));
  if (r % 2 == 0) MP_REQUIRE_OK(c.group_end());
  MP_CHECK(v == n - 1);
  return wrong ? 1 : 0;
}
}  // namespace

TEST_CASE("group: sends and receives to every peer progress together, grouped collectives run at group_end, shm / tcp / mixed") {
  run(3, net::shm_only, p2p_groups);
  run(2, net::tcp_only, p2p_groups);
  run(4, net::mixed, p2p_groups);
}

TEST_CASE("group: a send nobody receives ends at the deadline, naming the peer") {
  for (net how : {net::shm_only, net::tcp_only}) {
    run(2, how, [](default_communicator& c, store& kv) {
      // Set-up keeps the default deadline (slow under TSan on a loaded
      // machine); the call gets 1.5 s.
      c.set_timeout(milliseconds(1500));
      if (c.rank() == 1) {  // alive, never receives, until rank 0 has its answer
        (void)kv.get("test/sent", deadline::after(milliseconds(50000)));
        return 0;
      }
      std::vector<std::uint8_t> big(16u << 20, 1);
      c.group_start();
      MP_REQUIRE_OK(c.send(big.data(), big.size(), dtype::uint8, 1));
      status st = c.group_end();
      MP_REQUIRE_OK(kv.set("test/sent", "1"));
      MP_CHECK(st.code() == errc::timeout);
      MP_CHECK(st.message().find("group #1") != std::string::npos);
      MP_CHECK(st.message().find("sending to rank 1") != std::string::npos);
      return 0;
    }, std::chrono::seconds(60));
  }
}

TEST_CASE("a rank may exit right after sending on a link it just connected: the data still arrives") {
  // Ranks 0 and 2 of 4 are not ring neighbours: their shm link is made by the
  // first call between them. Rank 0 waits in the handshake first (the store's
  // polling backs off to 50 ms), rank 2 joins, sends 8 bytes into the new FIFO
  // and exits at once, typically before rank 0 polls again: the link rank 0
  // gets must still deliver them (the handshake completed; the segment holds
  // the data), as a TCP socket delivers what was sent before the peer closed.
  for (int round = 0; round < 3; ++round) {
    run(4, net::shm_only, [](default_communicator& c, store&) {
      std::int64_t v = -1;
      if (c.rank() == 0) {
        MP_REQUIRE_OK(c.recv(&v, 1, dtype::int64, 2));
        MP_CHECK(v == 4242);
      } else if (c.rank() == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        v = 4242;
        MP_REQUIRE_OK(c.send(&v, 1, dtype::int64, 0));
      }
      return 0;
    });
  }
}

TEST_CASE("argument errors are reported and leave the communicator usable") {
  run(2, net::shm_only, [](default_communicator& c, store&) {
    MP_CHECK(c.allreduce(nullptr, nullptr, 4, dtype::float32, reduce_op::sum).code() == errc::invalid_argument);
    int x = 1;
    MP_CHECK(c.broadcast(&x, 1, dtype::int32, 7).code() == errc::invalid_argument);
    MP_CHECK(c.allreduce(&x, &x, 1, static_cast<dtype>(99), reduce_op::sum).code() == errc::invalid_argument);
    MP_CHECK(c.allreduce(&x, &x, 1, dtype::int32, static_cast<reduce_op>(42)).code() == errc::invalid_argument);
    MP_CHECK(c.allreduce(&x, &x, SIZE_MAX / 2, dtype::int32, reduce_op::sum).code() == errc::invalid_argument);
    MP_REQUIRE_OK(c.allreduce(&x, 1));
    MP_CHECK(x == 2);
    return 0;
  });
}

namespace {
// Stands in for a GPU layer (cclite/cuda/device_buffers.hpp): "device memory"
// is one marked host array, which the CPU path must then never touch.
struct marking_hook final : device_hook {
  const void* marked = nullptr;
  int calls = 0;
  op_desc last;
  const work* before = nullptr;  // an _async call issued earlier: finished when run() starts?
  bool before_done = false;
  bool owns(const op_desc& d) const noexcept override { return d.send == marked || d.recv == marked; }
  status run(const op_desc& d) override {
    ++calls;
    last = d;
    if (before) before_done = before->done();
    return d.count == 13 ? make_error(errc::unsupported, "thirteen") : status();
  }
};
}  // namespace

TEST_CASE("device hook: calls on its buffers go to it, checked first; host buffers and children stay on the CPU path") {
  run(2, net::shm_only, [](default_communicator& c, store&) {
    marking_hook hook;
    float dev[16] = {}, host[4] = {1, 2, 3, 4};
    hook.marked = dev;
    MP_CHECK(c.get_device_hook() == nullptr);
    c.set_device_hook(&hook);
    MP_CHECK(c.get_device_hook() == &hook);
    // Blocking: the hook's, untouched by the CPU path.
    MP_REQUIRE_OK(c.allreduce(dev, dev, 4, dtype::float32, reduce_op::max));
    MP_CHECK(hook.calls == 1);
    MP_CHECK(hook.last.kind == collective_kind::allreduce);
    MP_CHECK(hook.last.count == 4 && hook.last.op == reduce_op::max && hook.last.send == dev);
    MP_CHECK(dev[0] == 0.0f);
    MP_REQUIRE_OK(c.broadcast(dev, 2, dtype::float32, 1));
    MP_CHECK(hook.calls == 2 && hook.last.kind == collective_kind::broadcast && hook.last.root == 1);
    // Host buffers: the CPU path, with the peers.
    MP_REQUIRE_OK(c.allreduce(host, host, 4, dtype::float32, reduce_op::sum));
    MP_CHECK(host[0] == 2.0f && host[3] == 8.0f);
    MP_CHECK(hook.calls == 2);
    // _async: ran before returning; the handle holds the status, ok or not.
    work w = c.allreduce_async(dev, dev, 13, dtype::float32, reduce_op::sum);
    MP_CHECK(w.valid());
    MP_CHECK(w.done());
    const status s13 = w.wait();
    MP_CHECK(s13.code() == errc::unsupported && s13.message() == "thirteen");
    work ok = c.allreduce_async(dev, dev, 4, dtype::float32, reduce_op::sum);
    MP_REQUIRE_OK(ok.wait());
    MP_CHECK(hook.calls == 4);
    // Argument checks come first: a bad dtype never reaches the hook.
    MP_CHECK(c.allreduce(dev, dev, 4, static_cast<dtype>(99), reduce_op::sum).code() == errc::invalid_argument);
    MP_CHECK(hook.calls == 4);
    // A split child has no hook of its own.
    auto child = c.split(0, c.rank());
    MP_REQUIRE_OK(child ? status() : child.error());
    MP_CHECK(child.value()->get_device_hook() == nullptr);
    // Issue order: a host call queued before a device call has finished when the hook runs.
    float queued[2] = {1, 1};
    work pending = c.allreduce_async(queued, queued, 2, dtype::float32, reduce_op::sum);
    hook.before = &pending;
    MP_REQUIRE_OK(c.allreduce(dev, dev, 4, dtype::float32, reduce_op::sum));
    MP_CHECK(hook.calls == 5 && hook.before_done);
    MP_REQUIRE_OK(pending.wait());
    MP_CHECK(queued[0] == 2.0f);
    hook.before = nullptr;
    // Removed: the marked array is ordinary memory again.
    c.set_device_hook(nullptr);
    dev[0] = static_cast<float>(c.rank() + 1);
    MP_REQUIRE_OK(c.allreduce(dev, dev, 1, dtype::float32, reduce_op::sum));
    MP_CHECK(dev[0] == 3.0f);
    MP_CHECK(hook.calls == 5);
    return 0;
  });
}

TEST_CASE("deadline: a rank that never joins the collective gives timeout, not a hang") {
  // CCLITE_TIMEOUT gives each call's deadline (one rank: no set-up to outlast it).
  {
    test::temp_dir dir;
    auto r = test::run_ranks(
        1,
        [&](int rank, int sz) {
          auto kv = test::open_dir_store(dir.path);
          auto made = default_communicator::create(*kv, rank, sz);
          MP_REQUIRE_OK(made);
          MP_CHECK(made.value()->timeout() == milliseconds(1500));
          return 0;
        },
        std::chrono::seconds(60), [](int) { ::setenv("CCLITE_TIMEOUT", "1.5", 1); });
    CHECK(r.all_ok());
  }
  // A zero timeout means none, in the options as in CCLITE_TIMEOUT=0 and
  // set_timeout(0): set-up and a call that waits 300 ms for its peer succeed.
  {
    test::temp_dir dir;
    auto r = test::run_ranks(2, [&](int rank, int sz) {
      auto kv = test::open_dir_store(dir.path);
      comm_options o;
      o.timeout = milliseconds(0);
      auto made = default_communicator::create(*kv, rank, sz, o);
      MP_REQUIRE_OK(made);
      default_communicator& c = *made.value();
      MP_CHECK(c.timeout() == milliseconds(-1));
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      float v = 1;
      MP_REQUIRE_OK(c.allreduce(&v, 1));
      MP_CHECK(v == 2.0f);
      c.set_timeout(milliseconds(0));
      MP_CHECK(c.timeout() == milliseconds(-1));
      return 0;
    });
    CHECK(r.all_ok());
  }
  // Ranks with that deadline once set up (set-up keeps a long one: slow under
  // TSan on a loaded machine).
  for (net n : {net::shm_only, net::tcp_only}) {
    run(2, n, [](default_communicator& c, store& kv) {
      c.set_timeout(milliseconds(1500));
      if (c.rank() == 1) {  // stays alive, never calls, until rank 0 has its answer
        (void)kv.get("test/answered", deadline::after(milliseconds(50000)));
        return 0;
      }
      float v = 1;
      status st = c.allreduce(&v, 1);
      MP_REQUIRE_OK(kv.set("test/answered", "1"));
      MP_CHECK(st.code() == errc::timeout);
      MP_CHECK(st.message().find("allreduce #1") != std::string::npos);
      MP_CHECK(st.message().find(c.peer(1).describe() + " did not call") != std::string::npos);
      // The communicator is now unusable, and says why.
      MP_CHECK(c.allreduce(&v, 1).code() == errc::timeout);
      return 0;
    }, std::chrono::seconds(60));
  }
}

TEST_CASE("abort from another thread unblocks a waiting collective") {
  run(2, net::shm_only, [](default_communicator& c, store&) {
    if (c.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(2));
      return 0;
    }
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      c.abort();
    });
    float v = 1;
    status st = c.allreduce(&v, 1);
    killer.join();
    MP_CHECK(st.code() == errc::aborted);
    MP_CHECK(c.barrier().code() == errc::aborted);
    return 0;
  });
}

// A rank killed mid-collective (4 ranks, shm and tcp, survivors naming the
// first lost rank), mismatches and a rank that never calls: tests/fault_test.cpp.
