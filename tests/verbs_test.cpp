// verbs_test: the InfiniBand / RoCE transport on a machine without RDMA hardware.
//
// What runs here: the pure parts (CCLITE_IB_HCA parsing and matching, GID
// choice over synthetic tables, the striping / credit bookkeeping of the data
// path, the store records), the environment, discovery with zero devices, and
// a real 2-rank job over communicator<verbs::transport, tcp::transport> that
// must fall back to tcp. The RDMA data path itself runs only where a device
// exists: tests/verbs/run.sh.
#include <cclite/verbs/transport.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
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

TEST_CASE("verbs transport: publish without a device records why and refuses every peer") {
  memory_store kv;
  std::vector<peer_info> peers(2);
  for (int r = 0; r < 2; ++r) {
    peers[r] = local_peer_info(r);
    peers[r].transports = {"verbs"};
  }
  std::atomic<bool> aborted{false};
  transport_context ctx;
  ctx.rank = 0;
  ctx.size = 2;
  ctx.peers = &peers;
  ctx.kv = &kv;
  ctx.aborted = &aborted;
  ctx.job_tag = "t";
  transport t(ctx);
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

// A 2-rank job over communicator<verbs, tcp>: both ranks must use `expect`
// for each other, and allreduces of several sizes (past the FIFO size when
// `env` shrinks it: wraparound and credits) must give exact sums.
void run_job(const char* expect, std::vector<std::pair<const char*, const char*>> env) {
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        auto kv = test::open_dir_store(dir.path);
        comm_options o;
        o.timeout = milliseconds(60000);
        auto c = verbs_comm::create(*kv, rank, size, o);
        MP_REQUIRE_OK(c);
        auto& comm = *c.value();
        MP_CHECK(std::strcmp(comm.transport_of(1 - rank), expect) == 0);
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
      },
      std::chrono::seconds(180), [&](int) {
        ::unsetenv("CCLITE_IB_DISABLE");
        for (const auto& kv : env) ::setenv(kv.first, kv.second, 1);
      });
  INFO(r.describe());
  CHECK(r.all_ok());
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
