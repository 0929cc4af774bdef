// verbs_test: the InfiniBand / RoCE transport on a machine without RDMA hardware.
//
// What runs here: the pure parts (CCLITE_IB_HCA parsing and matching, GID
// choice over synthetic tables, the striping / credit bookkeeping of the data
// path, the store records), the environment, discovery with zero devices, and
// a real 2-rank job over communicator<verbs::transport, tcp::transport> that
// must fall back to tcp. The RDMA data path itself runs only where a device
// exists: tests/verbs/run.sh.
#include <cclite/verbs/transport.hpp>
#include <cclite/verbs/fork.hpp>
#include <cclite/verbs/reg_cache.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <vector>

#include <cclite/bootstrap/memory_store.hpp>

#include "support/comm.hpp"
#include "support/mp.hpp"

using namespace cclite;
using namespace cclite::verbs;

namespace {

// Sets or unsets an environment variable for one scope.
struct scoped_env {
  std::string name;
  std::string old;
  bool had = false;
  scoped_env(const char* n, const char* v) : name(n) {
    if (const char* o = std::getenv(n)) { had = true; old = o; }
    if (v) ::setenv(n, v, 1); else ::unsetenv(n);
  }
  ~scoped_env() {
    if (had) ::setenv(name.c_str(), old.c_str(), 1); else ::unsetenv(name.c_str());
  }
};

hca_filter hca(const char* text) {
  auto f = parse_hca_list(text);
  REQUIRE(f.ok());
  return f.value();
}

gid_entry gid(int index, gid_kind k, std::initializer_list<int> bytes) {
  gid_entry e;
  e.index = index;
  e.kind = k;
  int i = 0;
  for (int b : bytes) e.raw[i++] = static_cast<std::uint8_t>(b);
  return e;
}
gid_entry ipv4_gid(int index, gid_kind k, int a, int b, int c, int d) {
  return gid(index, k, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d});
}

}  // namespace

// ---- CCLITE_IB_HCA -------------------------------------------------------------------

TEST_CASE("verbs hca: empty list keeps every device") {
  auto f = hca("");
  CHECK(f.matches("mlx5_0", 1));
  CHECK(f.matches("rxe0", 1));
  CHECK(hca("  ").entries.empty());
}

TEST_CASE("verbs hca: prefixes and ports") {
  auto f = hca("mlx5_0:1,mlx5_1");
  CHECK_FALSE(f.exclude);
  CHECK_FALSE(f.exact);
  REQUIRE(f.entries.size() == 2);
  CHECK(f.entries[0].port == 1);
  CHECK(f.entries[1].port == -1);
  CHECK(f.matches("mlx5_0", 1));
  CHECK_FALSE(f.matches("mlx5_0", 2));
  CHECK(f.matches("mlx5_1", 2));
  CHECK(f.matches("mlx5_10", 1));  // prefix: NCCL's rule
  CHECK_FALSE(f.matches("mlx4_0", 1));
}

TEST_CASE("verbs hca: exact names") {
  auto f = hca("=mlx5_1");
  CHECK(f.exact);
  CHECK(f.matches("mlx5_1", 1));
  CHECK_FALSE(f.matches("mlx5_10", 1));
}

TEST_CASE("verbs hca: exclusion") {
  auto f = hca("^mlx5_2");
  CHECK(f.exclude);
  CHECK(f.matches("mlx5_0", 1));
  CHECK_FALSE(f.matches("mlx5_2", 1));
  CHECK_FALSE(f.matches("mlx5_23", 1));
  auto g = hca("^=mlx5_2:1");
  CHECK(g.exclude);
  CHECK(g.exact);
  CHECK_FALSE(g.matches("mlx5_2", 1));
  CHECK(g.matches("mlx5_2", 2));
  CHECK(g.matches("mlx5_23", 1));
  CHECK(g.describe().find("except") != std::string::npos);
}

TEST_CASE("verbs hca: malformed lists are errors naming the value") {
  for (const char* bad : {"^", "=", "mlx5_0,,mlx5_1", "mlx5_0:", "mlx5_0:x", "mlx5_0:0", ":1", "mlx5_0:300"}) {
    auto f = parse_hca_list(bad);
    INFO(bad);
    REQUIRE_FALSE(f.ok());
    CHECK(f.error().code() == errc::invalid_argument);
    CHECK(f.error().message().find("CCLITE_IB_HCA") != std::string::npos);
  }
}

// ---- GID choice -----------------------------------------------------------------------

TEST_CASE("verbs gid: RoCE prefers the v2 IPv4-mapped entry") {
  std::vector<gid_entry> t = {
      gid(0, gid_kind::roce_v1, {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}),
      gid(1, gid_kind::roce_v2, {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}),
      ipv4_gid(2, gid_kind::roce_v1, 10, 0, 0, 2),
      ipv4_gid(3, gid_kind::roce_v2, 10, 0, 0, 2),
  };
  auto c = select_gid(t, true, -1);
  REQUIRE(c.ok());
  CHECK(c->index == 3);
  CHECK(c->reason.find("IPv4") != std::string::npos);
  CHECK(gid_to_string(t[3].raw) == "::ffff:10.0.0.2");
}

TEST_CASE("verbs gid: RoCE fallbacks without an IPv4 entry") {
  std::vector<gid_entry> global = {
      gid(0, gid_kind::roce_v2, {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}),
      gid(1, gid_kind::roce_v2, {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}),
  };
  CHECK(select_gid(global, true, -1)->index == 1);
  std::vector<gid_entry> v1_only = {gid(0, gid_kind::roce_v1, {0}), ipv4_gid(4, gid_kind::roce_v1, 1, 2, 3, 4)};
  CHECK(select_gid(v1_only, true, -1)->index == 4);  // index 0 is a zero GID: skipped
  auto none = select_gid({}, true, -1);
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().code() == errc::unsupported);
}

TEST_CASE("verbs gid: InfiniBand uses GID 0 and CCLITE_IB_GID_INDEX forces an index") {
  std::vector<gid_entry> t = {gid(0, gid_kind::ib, {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 9, 9, 9, 9, 9, 9, 9, 9}),
                              ipv4_gid(1, gid_kind::roce_v2, 10, 0, 0, 3)};
  CHECK(select_gid(t, false, -1)->index == 0);
  CHECK(select_gid(t, true, 0)->index == 0);
  auto missing = select_gid(t, true, 7);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message().find("CCLITE_IB_GID_INDEX=7") != std::string::npos);
}

TEST_CASE("verbs port speed from width and speed codes") {
  CHECK(port_gbps(2, 32) == doctest::Approx(100));   // 4x EDR
  CHECK(port_gbps(2, 64) == doctest::Approx(200));   // 4x HDR
  CHECK(port_gbps(1, 1) == doctest::Approx(2.5));    // 1x SDR
  CHECK(port_gbps(3, 32) == 0);                      // unknown width
}

// ---- data-path bookkeeping ---------------------------------------------------------------

TEST_CASE("verbs flow: striping positions and write cuts") {
  stripe s{16384, 4096, 2};
  CHECK(s.qp_of(0) == 0);
  CHECK(s.qp_of(4096) == 1);
  CHECK(s.qp_of(8192) == 0);
  CHECK(s.first(1) == 4096);
  CHECK(s.advance(0, 4096) == 8192);  // QP 0 jumps over QP 1's block
  CHECK(s.advance(100, 50) == 150);
  CHECK(s.advance(4096, 4096 + 10) == 12288 + 10);
  CHECK(s.next_write(0, 100) == 100);         // limited by what is committed
  CHECK(s.next_write(0, 100000) == 4096);     // one block at most
  CHECK(s.next_write(4096, 4000) == 0);       // QP 1 has nothing yet
  CHECK(s.next_write(16384 + 8192, 1 << 20) == 4096);
  std::uint64_t pos[2] = {8192, 4096 + 12};
  CHECK(s.prefix(pos, ~0ull) == 4108);
  CHECK(s.prefix(pos, 100) == 100);
  CHECK(s.offset(16384 + 5) == 5);
}

TEST_CASE("verbs flow: a write never crosses the ring end") {
  stripe s{12288, 8192, 1};  // ring not a multiple of the block
  CHECK(s.next_write(8192, 1 << 20) == 4096);  // stops at the ring end, not the block end
  CHECK(s.next_write(12288, 1 << 20) == 4096);  // then continues at offset 0 up to the block end
}

TEST_CASE("verbs flow: credits and immediates") {
  CHECK(send_limit(1000, 0, 4096) == 1000);
  CHECK(send_limit(10000, 0, 4096) == 4096);
  CHECK(send_limit(10000, 5000, 4096) == 9096);
  CHECK_FALSE(is_credit_imm(encode_data_imm(4096)));
  CHECK((encode_data_imm(4096) & imm_value_mask) == 4096);
  std::uint32_t c = encode_credit_imm(123);
  CHECK(is_credit_imm(c));
  CHECK(unwrap_credit(0, c) == 123);
  // Past 2^31 the immediate wraps; the sender's 64-bit count does not.
  std::uint64_t big = (std::uint64_t(5) << 31) + 77;
  CHECK(unwrap_credit(big - 1000, encode_credit_imm(big)) == big);
  CHECK(unwrap_credit(big, encode_credit_imm(big)) == big);  // a repeated credit changes nothing
  std::uint64_t id = make_wr_id(wr_kind::data, 15, 524288);
  CHECK(wr_id_kind(id) == wr_kind::data);
  CHECK(wr_id_qp(id) == 15);
  CHECK(wr_id_len(id) == 524288);
}

// The link's bookkeeping end to end without a device: a sender and a receiver
// built from flow.hpp, writes delivered in order per QP but interleaved
// across QPs at random, random commit and consume sizes, credits returned as
// the link returns them. Every byte must arrive, in order, unclobbered.
TEST_CASE("verbs flow: simulated stream over 3 QPs with out-of-order delivery") {
  const stripe s{16384, 4096, 3};
  std::vector<std::uint8_t> send_ring(s.cap), fifo(s.cap);
  std::mt19937 rng(42);
  struct write { std::uint64_t pos, len; };
  std::deque<write> wire[3];
  std::uint64_t committed = 0, completed = 0, remote_consumed = 0;
  std::uint64_t spos[3], cpos[3], rpos[3];
  for (int q = 0; q < 3; ++q) spos[q] = cpos[q] = rpos[q] = s.first(q);
  std::uint64_t received = 0, consumed = 0, checked = 0;
  const std::uint64_t total = 1 << 20;
  auto byte_at = [](std::uint64_t p) { return static_cast<std::uint8_t>((p * 7 + (p >> 13)) % 251); };
  int bad = 0;
  for (int step = 0; step < 200000 && checked < total; ++step) {
    switch (rng() % 4) {
      case 0: {  // writer: reserve contiguous space, fill, commit (multiples of 8)
        std::uint64_t free = s.cap - (committed - completed);
        std::uint64_t off = s.offset(committed);
        std::uint64_t n = std::min<std::uint64_t>({free, s.cap - off, total - committed, 8 * (1 + rng() % 700)});
        n -= n % 8;
        for (std::uint64_t i = 0; i < n; ++i) send_ring[off + i] = byte_at(committed + i);
        committed += n;
        break;
      }
      case 1: {  // poll: post what the credits allow
        std::uint64_t limit = send_limit(committed, remote_consumed, s.cap);
        for (int q = 0; q < 3; ++q) {
          for (std::uint64_t len; (len = s.next_write(spos[q], limit)) != 0;) {
            wire[q].push_back({spos[q], len});
            spos[q] = s.advance(spos[q], len);
          }
        }
        break;
      }
      case 2: {  // the fabric delivers the oldest write of one QP
        int q = static_cast<int>(rng() % 3);
        if (wire[q].empty()) break;
        write w = wire[q].front();
        wire[q].pop_front();
        std::memcpy(&fifo[s.offset(w.pos)], &send_ring[s.offset(w.pos)], w.len);
        rpos[q] = s.advance(rpos[q], w.len);  // receive completion (immediate = len)
        cpos[q] = s.advance(cpos[q], w.len);  // send completion
        received = s.prefix(rpos, ~0ull);
        completed = s.prefix(cpos, committed);
        break;
      }
      case 3: {  // reader: peek, check, consume, return the credit
        std::uint64_t off = s.offset(consumed);
        std::uint64_t n = std::min(received - consumed, s.cap - off);
        n = std::min<std::uint64_t>(n, 8 * (1 + rng() % 500));
        for (std::uint64_t i = 0; i < n; ++i) bad += fifo[off + i] != byte_at(consumed + i);
        consumed += n;
        checked = consumed;
        remote_consumed = unwrap_credit(remote_consumed, encode_credit_imm(consumed));
        break;
      }
    }
  }
  CHECK(bad == 0);
  CHECK(checked == total);
}

// ---- store records ----------------------------------------------------------------------

TEST_CASE("verbs records: QP attributes round-trip through the store text") {
  qp_record r;
  r.nqps = 3;
  r.qpn[0] = 0x1234;
  r.qpn[1] = 0xabcdef;
  r.qpn[2] = 7;
  r.psn = 0x123456;
  r.lid = 0x2a;
  for (int i = 0; i < 16; ++i) r.gid[i] = static_cast<std::uint8_t>(i * 17);
  r.mtu = 5;
  r.fifo_addr = 0x7f00deadbeef000ull;
  r.rkey = 0xfeedf00d;
  r.cap = 4u << 20;
  r.block = 512u << 10;
  auto p = qp_record::parse(r.serialize());
  REQUIRE(p.ok());
  CHECK(p->nqps == 3);
  CHECK(p->qpn[0] == 0x1234);
  CHECK(p->qpn[1] == 0xabcdef);
  CHECK(p->qpn[2] == 7);
  CHECK(p->psn == r.psn);
  CHECK(p->lid == r.lid);
  CHECK(std::memcmp(p->gid, r.gid, 16) == 0);
  CHECK(p->mtu == 5);
  CHECK(p->fifo_addr == r.fifo_addr);
  CHECK(p->rkey == r.rkey);
  CHECK(p->cap == r.cap);
  CHECK(p->block == r.block);
}

TEST_CASE("verbs records: malformed QP records are protocol errors") {
  qp_record r;
  r.cap = 4096;
  r.block = 4096;
  std::string good = r.serialize();
  REQUIRE(qp_record::parse(good).ok());
  for (std::string bad : {std::string(""), std::string("verbs2 n=1"), good.substr(0, good.size() - 3),
                          std::string("verbs1 n=2 qpn=1 psn=0 lid=0 mtu=0 addr=0 rkey=0 cap=1000 block=1000 gid=") +
                              std::string(32, '0'),
                          std::string("verbs1 n=1 qpn=1 psn=1000000 lid=0 mtu=0 addr=0 rkey=0 cap=1000 block=1000 gid=") +
                              std::string(32, '0')}) {
    auto p = qp_record::parse(bad);
    INFO(bad);
    REQUIRE_FALSE(p.ok());
    CHECK(p.error().code() == errc::protocol_error);
  }
}

TEST_CASE("verbs records: fabric records and the same-fabric rule") {
  fabric_record ib;
  ib.usable = true;
  ib.device = "mlx5_0";
  ib.port = 1;
  ib.layer = link_layer::infiniband;
  ib.subnet_prefix = 0xfe80000000000000ull;
  auto back = fabric_record::parse(ib.serialize());
  REQUIRE(back.ok());
  CHECK(back->usable);
  CHECK(back->device == "mlx5_0");
  CHECK(back->subnet_prefix == ib.subnet_prefix);
  std::string why;
  CHECK(fabric_compatible(ib, back.value(), why));

  fabric_record other_subnet = ib;
  other_subnet.subnet_prefix = 0xfe80000000000001ull;
  CHECK_FALSE(fabric_compatible(ib, other_subnet, why));
  CHECK(why.find("subnet") != std::string::npos);

  fabric_record roce = ib;
  roce.layer = link_layer::ethernet;
  roce.subnet_prefix = 1;
  CHECK_FALSE(fabric_compatible(ib, roce, why));
  CHECK(why.find("different fabrics") != std::string::npos);
  fabric_record roce2 = roce;
  roce2.subnet_prefix = 2;
  CHECK(fabric_compatible(roce, roce2, why));  // RoCE v2 is routed: subnets do not matter

  fabric_record none;
  none.reason = "no RDMA device (ibv_get_device_list found none)";
  auto nb = fabric_record::parse(none.serialize());
  REQUIRE(nb.ok());
  CHECK_FALSE(nb->usable);
  CHECK(nb->reason == none.reason);
  CHECK_FALSE(fabric_compatible(ib, nb.value(), why));
  CHECK(why.find("the peer has no usable RDMA port") != std::string::npos);
  CHECK_FALSE(fabric_record::parse("garbage").ok());
}

// ---- environment ------------------------------------------------------------------------

TEST_CASE("verbs env: defaults and NCCL fallbacks") {
  scoped_env a("CCLITE_IB_HCA", nullptr), b("NCCL_IB_HCA", "=mlx5_1:1"), c("CCLITE_IB_GID_INDEX", "3"),
      d("CCLITE_IB_QPS_PER_CONNECTION", nullptr), e("NCCL_IB_QPS_PER_CONNECTION", "4"),
      f("CCLITE_IB_TIMEOUT", "22"), g("CCLITE_IB_RETRY_CNT", nullptr), h("CCLITE_IB_BUFFSIZE", "1M");
  auto cfg = ib_config::from_env();
  REQUIRE(cfg.ok());
  CHECK(cfg->hca == "=mlx5_1:1");
  CHECK(cfg->gid_index == 3);
  CHECK(cfg->qps == 4);
  CHECK(cfg->timeout == 22);
  CHECK(cfg->retry_cnt == 7);
  CHECK(cfg->buffsize == (1u << 20));
  CHECK(cfg->block == (512u << 10));
}

TEST_CASE("verbs env: out-of-range values are errors naming the variable") {
  {
    scoped_env a("CCLITE_IB_QPS_PER_CONNECTION", "17");
    auto cfg = ib_config::from_env();
    REQUIRE_FALSE(cfg.ok());
    CHECK(cfg.error().message().find("CCLITE_IB_QPS_PER_CONNECTION=17") != std::string::npos);
  }
  {
    scoped_env a("CCLITE_IB_BUFFSIZE", "5000");
    CHECK_FALSE(ib_config::from_env().ok());
  }
  {
    scoped_env a("CCLITE_IB_GID_INDEX", "abc");
    CHECK_FALSE(ib_config::from_env().ok());
  }
}

TEST_CASE("verbs env: CCLITE_IB_DISABLE and NCCL_IB_DISABLE turn the transport off") {
  scoped_env a("CCLITE_IB_DISABLE", nullptr), b("NCCL_IB_DISABLE", nullptr);
  CHECK(transport::enabled().value());
  {
    scoped_env c("CCLITE_IB_DISABLE", "1");
    CHECK_FALSE(transport::enabled().value());
  }
  {
    scoped_env c("NCCL_IB_DISABLE", "1");
    CHECK_FALSE(transport::enabled().value());
  }
  {
    scoped_env c("CCLITE_IB_DISABLE", "0"), d("NCCL_IB_DISABLE", "1");
    CHECK(transport::enabled().value());  // cclite's own name wins
  }
  {
    scoped_env c("CCLITE_IB_DISABLE", "maybe");
    CHECK_FALSE(transport::enabled().ok());
  }
}

// ---- discovery and selection without hardware -------------------------------------------

TEST_CASE("verbs discovery: no device gives an empty list and a reason") {
  auto found = discover(ib_config{}, hca_filter{});
  REQUIRE(found.ok());
  if (found->devices > 0) {
    MESSAGE("this machine has RDMA devices; the zero-device checks do not apply");
    return;
  }
  CHECK(found->ports.empty());
  CHECK_FALSE(found->reason.empty());
  MESSAGE("reason: " << found->reason);
  CHECK(pick_port(found->ports, current_numa_node(), 0) == -1);
}

TEST_CASE("verbs pick_port: NUMA first then spread over local ranks") {
  std::vector<port_info> ports(4);
  for (int i = 0; i < 4; ++i) {
    ports[i].device = "mlx5_" + std::to_string(i);
    ports[i].active = true;
    ports[i].gid_ok = true;
    ports[i].numa_node = i < 2 ? 0 : 1;
  }
  ports[3].active = false;
  CHECK(pick_port(ports, 0, 0) == 0);
  CHECK(pick_port(ports, 0, 1) == 1);
  CHECK(pick_port(ports, 0, 2) == 0);
  CHECK(pick_port(ports, 1, 5) == 2);   // the only active port on node 1
  CHECK(pick_port(ports, -1, 2) == 2);  // NUMA unknown: spread over all active
  CHECK(pick_port(ports, 7, 0) == 0);   // no port on that node: all active ones
  CHECK(pick_port({}, 0, 0) == -1);
}

// Rank 0 of a 2-rank job on this host, with a memory store: the context a
// verbs transport is built from. `verbs_only`: the peers list only "verbs".
struct rank0_of_two {
  memory_store kv;
  std::vector<peer_info> peers;
  std::atomic<bool> aborted{false};
  transport_context ctx;
  explicit rank0_of_two(bool verbs_only) : peers(2) {
    for (int r = 0; r < 2; ++r) {
      peers[r] = local_peer_info(r);
      if (verbs_only) peers[r].transports = {"verbs"};
    }
    ctx.rank = 0;
    ctx.size = 2;
    ctx.peers = &peers;
    ctx.kv = &kv;
    ctx.aborted = &aborted;
    ctx.job_tag = "t";
  }
};

TEST_CASE("verbs transport: publish without a device records why and refuses every peer") {
  rank0_of_two env(true);
  auto& peers = env.peers;
  auto& kv = env.kv;
  transport t(env.ctx);
  REQUIRE(t.publish().ok());
  auto rec = kv.get("verbs/0", deadline::after(milliseconds(1000)));
  REQUIRE(rec.ok());
  auto parsed = fabric_record::parse(rec.value());
  REQUIRE(parsed.ok());
  if (parsed->usable) {
    MESSAGE("this machine has a usable RDMA port; the zero-device checks do not apply");
    return;
  }
  CHECK_FALSE(parsed->reason.empty());
  CHECK_FALSE(t.can_connect(peers[0], peers[1]));
  CHECK_FALSE(t.can_connect(peers[0], peers[0]));
  CHECK(t.registrations() == nullptr);  // no device: no protection domain, no cache
  auto l = t.connect(1, deadline::after(milliseconds(100)));
  REQUIRE_FALSE(l.ok());
  CHECK(l.error().code() == errc::invalid_argument);
}

TEST_CASE("verbs transport: a bad setting fails publish and still leaves a record for the peers") {
  memory_store kv;
  std::vector<peer_info> peers(2);
  for (int r = 0; r < 2; ++r) peers[r] = local_peer_info(r);
  transport_context ctx;
  ctx.rank = 1;
  ctx.size = 2;
  ctx.peers = &peers;
  ctx.kv = &kv;
  transport t(ctx);
  scoped_env bad("CCLITE_IB_HCA", "mlx5_0,,mlx5_1");
  status st = t.publish();
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == errc::invalid_argument);
  auto rec = kv.get("verbs/1", deadline::after(milliseconds(1000)));
  REQUIRE(rec.ok());
  auto parsed = fabric_record::parse(rec.value());
  REQUIRE(parsed.ok());
  CHECK_FALSE(parsed->usable);
  CHECK(parsed->reason.find("CCLITE_IB_HCA") != std::string::npos);
}

namespace {
using verbs_comm = communicator<verbs::transport, tcp::transport>;

// Whether this machine has an active RDMA port CCLITE_IB_HCA keeps.
bool have_rdma() {
  auto cfg = ib_config::from_env();
  auto f = parse_hca_list(cfg ? cfg->hca : std::string());
  if (!cfg || !f) return false;
  auto found = discover(cfg.value(), f.value());
  return found && pick_port(found->ports, -1, 0) >= 0;
}

using env_list = std::vector<std::pair<const char*, const char*>>;

// A 2-rank job over communicator<verbs, tcp> with `env` set on both ranks:
// both must use `expect` for each other, then `body` runs on each rank.
void run_pair(const char* expect, const env_list& env, const std::function<int(verbs_comm&, int)>& body) {
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        auto kv = test::open_dir_store(dir.path);
        comm_options o;
        o.timeout = milliseconds(60000);
        auto c = verbs_comm::create(*kv, rank, size, o);
        MP_REQUIRE_OK(c);
        MP_CHECK(std::strcmp(c.value()->transport_of(1 - rank), expect) == 0);
        return body(*c.value(), rank);
      },
      std::chrono::seconds(180), [&](int) {
        ::unsetenv("CCLITE_IB_DISABLE");
        for (const auto& kv : env) ::setenv(kv.first, kv.second, 1);
      });
  INFO(r.describe());
  CHECK(r.all_ok());
}

// Allreduces of several sizes (past the FIFO size when `env` shrinks it:
// wraparound and credits) must give exact sums.
void run_job(const char* expect, const env_list& env) {
  run_pair(expect, env, [](verbs_comm& comm, int rank) {
    for (std::size_t n : {std::size_t(1), std::size_t(1031), std::size_t(100003), std::size_t(1) << 21}) {
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 97);
      MP_REQUIRE_OK(comm.allreduce(v.data(), v.size()));
      int wrong = 0;
      for (std::size_t i = 0; i < n; ++i) wrong += v[i] != 3.0f * static_cast<float>(i % 97);
      MP_CHECK(wrong == 0);
    }
    MP_REQUIRE_OK(comm.barrier());
    return 0;
  });
}
}  // namespace

TEST_CASE("verbs communicator: 2 ranks without RDMA fall back to tcp and allreduce") {
  if (have_rdma()) {
    MESSAGE("this machine has an active RDMA port: see the hardware test cases instead");
    return;
  }
  run_job("tcp", {});
}

TEST_CASE("verbs communicator: CCLITE_IB_DISABLE=1 is honoured") {
  // The transport is not even enabled: "verbs" is absent from the peer records.
  scoped_env a("CCLITE_IB_DISABLE", "1");
  auto names = transport_set<verbs::transport, tcp::transport>::enabled_names();
  REQUIRE(names.ok());
  REQUIRE(names->size() == 1);
  CHECK(names->at(0) == "tcp");
  run_job("tcp", {{"CCLITE_IB_DISABLE", "1"}});
  run_job("tcp", {{"NCCL_IB_DISABLE", "1"}});
}

// ---- on RDMA hardware only (tests/verbs/run.sh) -------------------------------------------

TEST_CASE("verbs hardware: 2 ranks over RDMA with default settings") {
  if (!have_rdma()) {
    MESSAGE("no active RDMA port here: skipped (tests/verbs/run.sh runs it where one exists)");
    return;
  }
  run_job("verbs", {});
}

TEST_CASE("verbs hardware: small FIFO and several QPs force wraparound and credits") {
  if (!have_rdma()) {
    MESSAGE("no active RDMA port here: skipped");
    return;
  }
  // 64 KiB FIFO, 16 KiB blocks on 3 QPs: an 8 MiB allreduce laps the ring
  // hundreds of times and every block boundary changes QP.
  run_job("verbs", {{"CCLITE_IB_BUFFSIZE", "64K"}, {"CCLITE_IB_BLOCK", "16K"}, {"CCLITE_IB_QPS_PER_CONNECTION", "3"},
                    {"CCLITE_IB_SPIN_US", "0"}});
}

TEST_CASE("verbs hardware: a receiver that comes late gets every byte (credits hold the sender back)") {
  if (!have_rdma()) {
    MESSAGE("no active RDMA port here: skipped");
    return;
  }
  // Rank 0 sends 4 MiB into a 64 KiB FIFO while rank 1 sleeps before it
  // receives: rank 0 must stop once the FIFO is full and go on only as rank 1
  // returns credits. A sender that wrote past its credits would overwrite
  // bytes rank 1 has not read yet.
  const env_list small_fifo = {{"CCLITE_IB_BUFFSIZE", "64K"}, {"CCLITE_IB_BLOCK", "16K"},
                                {"CCLITE_IB_QPS_PER_CONNECTION", "3"}};
  run_pair("verbs", small_fifo, [](verbs_comm& comm, int rank) {
    const std::size_t n = std::size_t(1) << 20;
    std::vector<std::uint32_t> v(n);
    for (int round = 0; round < 3; ++round) {
      if (rank == 0) {
        for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint32_t>(i * 2654435761u + round);
        MP_REQUIRE_OK(comm.send(v.data(), n, dtype::uint32, 1));
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        MP_REQUIRE_OK(comm.recv(v.data(), n, dtype::uint32, 0));
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < n; ++i) wrong += v[i] != static_cast<std::uint32_t>(i * 2654435761u + round);
        if (wrong) std::fprintf(stderr, "rank 1: round %d: %zu of %zu words wrong\n", round, wrong, n);
        MP_CHECK(wrong == 0);
      }
    }
    MP_REQUIRE_OK(comm.barrier());
    return 0;
  });
}

TEST_CASE("verbs hardware: the transport's registration cache registers a user buffer with ibv_reg_mr") {
  if (!have_rdma()) {
    MESSAGE("no active RDMA port here: skipped");
    return;
  }
  rank0_of_two env(false);
  transport t(env.ctx);
  REQUIRE(t.publish().ok());
  REQUIRE(t.registrations() != nullptr);
  std::vector<char> buf(3 << 20);
  auto h = t.registrations()->find_or_register(buf.data() + 100, 1 << 20);
  REQUIRE_MESSAGE(h.ok(), h.error().message());
  CHECK(h->cached());
  CHECK(h->registration().covers(reinterpret_cast<std::uintptr_t>(buf.data() + 100), 1 << 20));
  auto again = t.registrations()->find_or_register(buf.data() + 4096, 1000);
  REQUIRE(again.ok());
  CHECK(again->lkey() == h->lkey());
  CHECK(t.registrations()->stats().hits == 1);
  h->release();
  again->release();
  CHECK(t.registrations()->invalidate(buf.data(), buf.size()) == 1);
  CHECK(t.registrations()->stats().bytes_registered == 0);
}

// ---- registration cache for user buffers (fake registrar) ------------------------------

namespace {

// Records every reg / dereg; fails on demand. Addresses are plain numbers:
// nothing is touched, so any value works.
struct fake_log {
  struct call {
    bool reg;
    std::uintptr_t base;
    std::size_t length;
  };
  std::vector<call> calls;
  std::vector<std::uintptr_t> live;  // bases registered now
  std::uint32_t next_key = 100;
  int fail_errno = 0;
  std::size_t regs() const {
    std::size_t n = 0;
    for (const auto& c : calls) n += c.reg;
    return n;
  }
  std::size_t deregs() const { return calls.size() - regs(); }
  bool is_live(std::uintptr_t b) const { return std::find(live.begin(), live.end(), b) != live.end(); }
};

struct fake_registrar {
  fake_log* log;
  result<mem_registration> reg(std::uintptr_t base, std::size_t length) {
    if (log->fail_errno) {
      return make_error(errc::resource_exhausted, "fake ibv_reg_mr failed: %s (%s)", std::strerror(log->fail_errno),
                        reg_failure_hint(log->fail_errno));
    }
    log->calls.push_back({true, base, length});
    log->live.push_back(base);
    mem_registration r;
    r.base = base;
    r.length = length;
    r.lkey = log->next_key++;
    r.rkey = r.lkey + 1000;
    return r;
  }
  void dereg(const mem_registration& r) noexcept {
    log->calls.push_back({false, r.base, r.length});
    log->live.erase(std::find(log->live.begin(), log->live.end(), r.base));
  }
};

using fake_cache = reg_cache<fake_registrar>;
constexpr std::size_t pg = 4096;
const void* at(std::uintptr_t a) { return reinterpret_cast<const void*>(a); }

reg_cache_limits small_limits(std::size_t entries, std::size_t bytes, bool merge = true) {
  reg_cache_limits l;
  l.max_entries = entries;
  l.max_bytes = bytes;
  l.page_size = pg;
  l.merge = merge;
  return l;
}

}  // namespace

TEST_CASE("verbs reg_cache: miss registers page-aligned, then a contained range hits") {
  fake_log log;
  fake_cache c(fake_registrar{&log}, small_limits(8, 1 << 20));
  {
    auto h = c.find_or_register(at(0x10010), 100);  // inside one page
    REQUIRE(h.ok());
    CHECK(h->cached());
    CHECK(h->base() == 0x10000);
    CHECK(h->length() == pg);
    CHECK(h->lkey() == 100);
    CHECK(h->rkey() == 1100);
  }
  {
    auto h = c.find_or_register(at(0x10ff0), 0x20);  // crosses into the next page
    REQUIRE(h.ok());
    CHECK(h->base() == 0x10000);   // merged with the touching entry
    CHECK(h->length() == 2 * pg);
  }
  CHECK(log.regs() == 2);
  CHECK(log.deregs() == 1);  // the one-page entry was swallowed
  auto h = c.find_or_register(at(0x10800), 0x1000);  // contained: a hit
  REQUIRE(h.ok());
  CHECK(h->base() == 0x10000);
  CHECK(log.regs() == 2);
  auto st = c.stats();
  CHECK(st.hits == 1);
  CHECK(st.misses == 2);
  CHECK(st.merged == 1);
  CHECK(st.entries == 1);
  CHECK(st.bytes_registered == 2 * pg);
}

TEST_CASE("verbs reg_cache: page rounding of start and end") {
  fake_log log;
  fake_cache c(fake_registrar{&log}, small_limits(8, 1 << 20, false));
  auto h = c.find_or_register(at(0x20fff), 2);  // last byte of one page, first of the next
  REQUIRE(h.ok());
  CHECK(h->base() == 0x20000);
  CHECK(h->length() == 2 * pg);
  auto h2 = c.find_or_register(at(0x30000), pg);  // aligned: exactly one page
  REQUIRE(h2.ok());
  CHECK(h2->base() == 0x30000);
  CHECK(h2->length() == pg);
  CHECK(c.page_size() == pg);
  CHECK(system_page_size() >= 4096);
  CHECK((system_page_size() & (system_page_size() - 1)) == 0);
  auto bad = c.find_or_register(at(0x1000), 0);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code() == errc::invalid_argument);
  auto wrap = c.find_or_register(at(UINTPTR_MAX - 10), 100);
  REQUIRE_FALSE(wrap.ok());
  CHECK(wrap.error().code() == errc::invalid_argument);
}

TEST_CASE("verbs reg_cache: without merging, an overlapping request replaces the entries it overlaps") {
  fake_log log;
  fake_cache c(fake_registrar{&log}, small_limits(8, 1 << 20, false));
  { auto h = c.find_or_register(at(0x10000), pg); REQUIRE(h.ok()); }
  { auto h = c.find_or_register(at(0x11000), pg); REQUIRE(h.ok()); }  // adjacent: kept apart
  CHECK(c.stats().entries == 2);
  auto h = c.find_or_register(at(0x10800), pg);  // overlaps both
  REQUIRE(h.ok());
  CHECK(h->base() == 0x10000);
  CHECK(h->length() == 2 * pg);
  CHECK(c.stats().entries == 1);
  CHECK(c.stats().merged == 2);
  CHECK(log.live.size() == 1);
}

TEST_CASE("verbs reg_cache: merging over a held entry keeps it registered until released") {
  fake_log log;
  fake_cache c(fake_registrar{&log}, small_limits(8, 1 << 20));
  auto a = c.find_or_register(at(0x10000), pg);
  REQUIRE(a.ok());
  auto b = c.find_or_register(at(0x10800), pg);  // pages 0x10000..0x12000: a no longer covers it
  REQUIRE(b.ok());
  CHECK(b->base() == 0x10000);
  CHECK(b->length() == 2 * pg);
  CHECK(log.live.size() == 2);  // a's registration is still in use
  CHECK(c.stats().entries == 1);
  CHECK(c.stats().bytes_registered == 3 * pg);
  a->release();
  CHECK(log.live.size() == 1);
  CHECK(c.stats().bytes_registered == 2 * pg);
  CHECK(c.stats().merged == 1);
  // A union larger than the byte limit is not merged: just the requested pages.
  fake_cache d(fake_registrar{&log}, small_limits(8, 3 * pg));
  { auto h = d.find_or_register(at(0x40000), 2 * pg); REQUIRE(h.ok()); }
  auto e = d.find_or_register(at(0x42000), 2 * pg);  // adjacent; union of 4 pages > 3
  REQUIRE(e.ok());
  CHECK(e->cached());
  CHECK(e->base() == 0x42000);
  CHECK(e->length() == 2 * pg);
  CHECK(d.stats().evictions == 1);  // the 0x40000 entry made room
}

TEST_CASE("verbs reg_cache: LRU eviction when the entry or byte limit is reached") {
  fake_log log;
  SUBCASE("entries") {
    fake_cache c(fake_registrar{&log}, small_limits(2, 1 << 20, false));
    { auto h = c.find_or_register(at(0x10000), 10); REQUIRE(h.ok()); }  // A
    { auto h = c.find_or_register(at(0x20000), 10); REQUIRE(h.ok()); }  // B
    { auto h = c.find_or_register(at(0x10000), 10); REQUIRE(h.ok()); }  // A again: B is now LRU
    { auto h = c.find_or_register(at(0x30000), 10); REQUIRE(h.ok()); }  // C evicts B
    CHECK(log.is_live(0x10000));
    CHECK_FALSE(log.is_live(0x20000));
    CHECK(log.is_live(0x30000));
    CHECK(c.stats().evictions == 1);
    { auto h = c.find_or_register(at(0x40000), 10); REQUIRE(h.ok()); }  // D evicts A
    CHECK_FALSE(log.is_live(0x10000));
    CHECK(c.stats().evictions == 2);
    CHECK(c.stats().entries == 2);
  }
  SUBCASE("bytes") {
    fake_cache c(fake_registrar{&log}, small_limits(16, 4 * pg, false));
    { auto h = c.find_or_register(at(0x10000), 2 * pg); REQUIRE(h.ok()); }
    { auto h = c.find_or_register(at(0x20000), pg); REQUIRE(h.ok()); }
    { auto h = c.find_or_register(at(0x30000), pg); REQUIRE(h.ok()); }
    CHECK(c.stats().bytes_registered == 4 * pg);
    { auto h = c.find_or_register(at(0x40000), 2 * pg); REQUIRE(h.ok()); }  // evicts the 2-page LRU
    CHECK_FALSE(log.is_live(0x10000));
    CHECK(c.stats().bytes_registered == 4 * pg);
    { auto h = c.find_or_register(at(0x50000), 2 * pg); REQUIRE(h.ok()); }  // evicts 0x20000 and 0x30000
    CHECK_FALSE(log.is_live(0x20000));
    CHECK_FALSE(log.is_live(0x30000));
    CHECK(c.stats().evictions == 3);
    CHECK(c.stats().peak_bytes == 4 * pg);
  }
}

TEST_CASE("verbs reg_cache: held entries are never evicted; when all are held the request is uncached") {
  fake_log log;
  fake_cache c(fake_registrar{&log}, small_limits(2, 1 << 20, false));
  auto a = c.find_or_register(at(0x10000), 10);
  auto b = c.find_or_register(at(0x20000), 10);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  {
    auto x = c.find_or_register(at(0x30000), 10);  // both held: registered for this use only
    REQUIRE(x.ok());
    CHECK_FALSE(x->cached());
    CHECK(x->base() == 0x30000);
    CHECK(log.is_live(0x30000));
    CHECK(c.stats().evictions == 0);
    CHECK(c.stats().entries == 2);
  }
  CHECK_FALSE(log.is_live(0x30000));  // released: deregistered at once
  CHECK(c.stats().uncached == 1);
  a->release();
  a->release();  // idempotent
  auto y = c.find_or_register(at(0x40000), 10);  // now a is free to evict, b is still held
  REQUIRE(y.ok());
  CHECK(y->cached());
  CHECK_FALSE(log.is_live(0x10000));
  CHECK(log.is_live(0x20000));
  // A request larger than the byte limit is never cached.
  fake_cache small(fake_registrar{&log}, small_limits(4, 2 * pg));
  auto big = small.find_or_register(at(0x100000), 3 * pg);
  REQUIRE(big.ok());
  CHECK_FALSE(big->cached());
  // Handles move; the moved-from one releases nothing.
  auto moved = std::move(b.value());
  CHECK(moved);
  CHECK(moved.base() == 0x20000);
}

TEST_CASE("verbs reg_cache: invalidate drops and deregisters overlapping entries") {
  fake_log log;
  fake_cache c(fake_registrar{&log}, small_limits(8, 1 << 20, false));
  { auto h = c.find_or_register(at(0x10000), pg); REQUIRE(h.ok()); }
  { auto h = c.find_or_register(at(0x20000), pg); REQUIRE(h.ok()); }
  { auto h = c.find_or_register(at(0x30000), pg); REQUIRE(h.ok()); }
  auto held = c.find_or_register(at(0x30000), 8);
  REQUIRE(held.ok());
  CHECK(c.invalidate(at(0x10fff), 2 + 0x10000) == 2);  // ends of the 0x10000 and 0x20000 entries
  CHECK_FALSE(log.is_live(0x10000));
  CHECK_FALSE(log.is_live(0x20000));
  CHECK(c.invalidate(at(0x40000), pg) == 0);
  CHECK(c.invalidate(at(0x30100), 1) == 1);  // held: out of the lookup, registered until released
  CHECK(log.is_live(0x30000));
  CHECK(c.stats().entries == 0);
  held->release();
  CHECK_FALSE(log.is_live(0x30000));
  CHECK(c.stats().invalidated == 3);
  CHECK(c.stats().bytes_registered == 0);
  // The same addresses register afresh afterwards (new keys).
  auto again = c.find_or_register(at(0x10000), pg);
  REQUIRE(again.ok());
  CHECK(c.stats().hits == 1);  // only `held` hit
  CHECK(log.is_live(0x10000));
}

TEST_CASE("verbs reg_cache: max 0 registers and deregisters per use") {
  fake_log log;
  fake_cache c(fake_registrar{&log}, small_limits(8, 0));
  CHECK_FALSE(c.limits().enabled());
  for (int i = 0; i < 3; ++i) {
    auto h = c.find_or_register(at(0x10010), 100);
    REQUIRE(h.ok());
    CHECK_FALSE(h->cached());
    CHECK(h->base() == 0x10000);
    CHECK(log.live.size() == 1);
  }
  CHECK(log.regs() == 3);
  CHECK(log.deregs() == 3);
  CHECK(log.live.empty());
  CHECK(c.stats().hits == 0);
  CHECK(c.stats().misses == 3);
  CHECK(c.stats().uncached == 3);
  CHECK(c.invalidate(at(0x10000), pg) == 0);
}

TEST_CASE("verbs reg_cache: a registrar failure names the range and the limit") {
  fake_log log;
  fake_cache c(fake_registrar{&log}, small_limits(8, 1 << 20));
  log.fail_errno = ENOMEM;
  auto h = c.find_or_register(at(0x10010), 100);
  REQUIRE_FALSE(h.ok());
  CHECK(h.error().code() == errc::resource_exhausted);
  const std::string& m = h.error().message();
  MESSAGE(m);
  CHECK(m.find("0x10010") != std::string::npos);
  CHECK(m.find("0x10074") != std::string::npos);
  CHECK(m.find("ulimit -l") != std::string::npos);
  CHECK(m.find(std::strerror(ENOMEM)) != std::string::npos);
  CHECK(c.stats().entries == 0);
  CHECK(c.stats().bytes_registered == 0);
  log.fail_errno = 0;
  CHECK(c.find_or_register(at(0x10010), 100).ok());
  CHECK(std::string(reg_failure_hint(EFAULT)).find("invalidate") != std::string::npos);
}

TEST_CASE("verbs reg_cache: CCLITE_IB_REG_CACHE_MAX_MB") {
  {
    scoped_env a("CCLITE_IB_REG_CACHE_MAX_MB", nullptr);
    auto l = reg_cache_limits::from_env();
    REQUIRE(l.ok());
    CHECK(l->max_bytes == std::size_t(1024) << 20);
    CHECK(l->enabled());
  }
  {
    scoped_env a("CCLITE_IB_REG_CACHE_MAX_MB", "64");
    auto l = reg_cache_limits::from_env();
    REQUIRE(l.ok());
    CHECK(l->max_bytes == std::size_t(64) << 20);
    auto cfg = ib_config::from_env();
    REQUIRE(cfg.ok());
    CHECK(cfg->reg_cache_max_mb == 64);
    CHECK(reg_cache_limits::from_config(cfg.value()).max_bytes == std::size_t(64) << 20);
  }
  {
    scoped_env a("CCLITE_IB_REG_CACHE_MAX_MB", "0");
    auto l = reg_cache_limits::from_env();
    REQUIRE(l.ok());
    CHECK_FALSE(l->enabled());
  }
  for (const char* bad : {"abc", "-1", "1G", "12x", "2000000"}) {
    CAPTURE(bad);
    scoped_env a("CCLITE_IB_REG_CACHE_MAX_MB", bad);
    auto l = reg_cache_limits::from_env();
    REQUIRE_FALSE(l.ok());
    CHECK(l.error().code() == errc::invalid_argument);
    CHECK(l.error().message().find("CCLITE_IB_REG_CACHE_MAX_MB") != std::string::npos);
    auto cfg = ib_config::from_env();
    REQUIRE_FALSE(cfg.ok());
    CHECK(cfg.error().message().find("CCLITE_IB_REG_CACHE_MAX_MB") != std::string::npos);
  }
}

// ---- ibv_fork_init ------------------------------------------------------------------------

namespace {
int fork_init_calls = 0;
int fake_fork_init_ok() { return ++fork_init_calls, 0; }
int fake_fork_init_einval() { return ++fork_init_calls, EINVAL; }
}  // namespace

TEST_CASE("verbs fork: ibv_fork_init runs once, is skipped with CCLITE_IB_FORK_SAFE=0, warns on failure") {
  fork_init_calls = 0;
  {
    fork_initializer f(&fake_fork_init_ok);
    CHECK_FALSE(f.ensure(false).called);  // skipped, and the one call is not used up
    CHECK(fork_init_calls == 0);
    const auto& o = f.ensure(true);
    CHECK(o.called);
    CHECK(o.rc == 0);
    CHECK(o.warning.empty());
    f.ensure(true);
    f.ensure(true);
    CHECK(fork_init_calls == 1);
  }
  {
    fork_initializer f(&fake_fork_init_einval);
    const auto& o = f.ensure(true);
    CHECK(o.rc == EINVAL);
    CHECK(o.warning.find("registered before") != std::string::npos);
    CHECK(o.warning.find("RDMAV_FORK_SAFE") != std::string::npos);
    f.ensure(true);
    CHECK(fork_init_calls == 2);
  }
  {
    scoped_env a("CCLITE_IB_FORK_SAFE", nullptr);
    auto cfg = ib_config::from_env();
    REQUIRE(cfg.ok());
    CHECK(cfg->fork_safe);
  }
  {
    scoped_env a("CCLITE_IB_FORK_SAFE", "0");
    auto cfg = ib_config::from_env();
    REQUIRE(cfg.ok());
    CHECK_FALSE(cfg->fork_safe);
  }
  {
    scoped_env a("CCLITE_IB_FORK_SAFE", "maybe");
    auto cfg = ib_config::from_env();
    REQUIRE_FALSE(cfg.ok());
    CHECK(cfg.error().message().find("CCLITE_IB_FORK_SAFE") != std::string::npos);
  }
}

TEST_CASE("verbs fork: the real ibv_fork_init is harmless without devices") {
  // Where nothing is registered yet it returns 0 (rdma-core: a no-op on kernels
  // with copy-on-fork for pinned pages). Other tests in this binary may have
  // registered nothing: there is no device here.
  fork_initializer f;
  const auto& o = f.ensure(true);
  CHECK(o.called);
  if (o.rc != 0) MESSAGE("ibv_fork_init returned " << o.rc << ": " << o.warning);
  CHECK(f.ensure(true).rc == o.rc);
  CHECK(&ensure_fork_init(true) == &ensure_fork_init(true));
}
