// The rendezvous store's job-token handshake: SHA-256 / HMAC-SHA256 against
// the published test vectors, then real servers and clients (and real
// processes through open_store) with right and wrong tokens.
#include <cclite/core/sha256.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <thread>

#include <cclite/tcp/rendezvous.hpp>
#include <cclite/tcp/store_auth.hpp>
#include <cclite/tcp/store_client.hpp>
#include <cclite/tcp/store_server.hpp>

#include "support/mp.hpp"

using namespace cclite;
using std::chrono::milliseconds;

namespace {

std::string hex_of(const sha256_digest& d, std::size_t n = 32) { return to_hex(d.data(), n); }

std::string hmac_hex(const std::string& key, const std::string& msg, std::size_t n = 32) {
  return hex_of(hmac_sha256(key, msg), n);
}

// A free loopback port: bind an ephemeral one, then let it go.
std::uint16_t free_port() {
  auto probe = tcp::store_server::start("127.0.0.1", 0);
  REQUIRE(probe.ok());
  return probe.value()->port();
}

const char* const refusal = "refused this process: wrong job token (CCLITE_RDZV_TOKEN)";

}  // namespace

TEST_CASE("sha256 FIPS 180-4 vectors") {
  CHECK(hex_of(sha256::hash("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex_of(sha256::hash("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex_of(sha256::hash("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', fed in uneven pieces to cross block boundaries.
  sha256 s;
  std::string piece(997, 'a');
  std::size_t left = 1000000;
  while (left > 0) {
    std::size_t k = left < piece.size() ? left : piece.size();
    s.update(piece.data(), k);
    left -= k;
  }
  CHECK(hex_of(s.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Padding edge cases: 55, 56 and 64 bytes (one or two final blocks).
  for (std::size_t n : {55u, 56u, 63u, 64u, 65u}) {
    sha256 a;
    std::string m(n, 'x');
    for (char c : m) a.update(&c, 1);
    CHECK(hex_of(a.finish()) == hex_of(sha256::hash(m)));
  }
}

TEST_CASE("hmac_sha256 RFC 4231 vectors") {
  CHECK(hmac_hex(std::string(20, '\x0b'), "Hi There") ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(hmac_hex("Jefe", "what do ya want for nothing?") ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(hmac_hex(std::string(20, '\xaa'), std::string(50, '\xdd')) ==
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4 += static_cast<char>(i);
  CHECK(hmac_hex(key4, std::string(50, '\xcd')) ==
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  CHECK(hmac_hex(std::string(20, '\x0c'), "Test With Truncation", 16) == "a3b6167473100ee06e0c796c2955552b");
  CHECK(hmac_hex(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First") ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(hmac_hex(std::string(131, '\xaa'),
                 "This is a test using a larger than block-size key and a larger than block-size data. The "
                 "key needs to be hashed before being used by the HMAC algorithm.") ==
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
  CHECK(hmac_hex("", "") == "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
}

TEST_CASE("store handshake proof") {
  std::array<std::uint8_t, tcp::proto::nonce_bytes> n1{}, n2{};
  REQUIRE(tcp::proto::make_nonce(n1).ok());
  REQUIRE(tcp::proto::make_nonce(n2).ok());
  CHECK(n1 != n2);
  auto p = tcp::proto::auth_proof("secret", n1);
  CHECK(tcp::proto::auth_ok("secret", n1, p));
  CHECK_FALSE(tcp::proto::auth_ok("secreT", n1, p));
  CHECK_FALSE(tcp::proto::auth_ok("secret", n2, p));  // a replayed proof fails a fresh nonce
  CHECK_FALSE(tcp::proto::auth_ok("", n1, p));
}

TEST_CASE("tcp store refuses a wrong job token and keeps serving") {
  tcp::server_options o;
  o.token = "job-secret";
  auto srv = tcp::store_server::start("127.0.0.1", 0, o);
  REQUIRE(srv.ok());
  auto& s = *srv.value();
  auto good = tcp::store_client::connect("127.0.0.1", s.port(), deadline::after(milliseconds(10000)),
                                         milliseconds(10000), "job-secret");
  REQUIRE_MESSAGE(good.ok(), good.error().to_string());
  CHECK(good.value()->set("k", "v").ok());

  for (std::string wrong : {std::string("job-secreT"), std::string(), std::string(200, 'x')}) {
    // A refusal is final: it comes back well before this deadline, not as a timeout.
    auto bad = tcp::store_client::connect("127.0.0.1", s.port(), deadline::after(milliseconds(60000)),
                                          milliseconds(60000), wrong);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().code() == errc::bootstrap_error);
    CHECK_MESSAGE(bad.error().message().find("store at 127.0.0.1:" + std::to_string(s.port()) + " " + refusal) !=
                      std::string::npos,
                  bad.error().message());
    // The token never appears in what the client reports.
    if (!wrong.empty()) CHECK(bad.error().message().find(wrong) == std::string::npos);
  }
  CHECK(s.auth_failures() == 3);
  auto v = good.value()->get("k", deadline::after(milliseconds(5000)));
  REQUIRE_MESSAGE(v.ok(), v.error().to_string());
  CHECK(v.value() == "v");

  // Empty tokens on both sides: the handshake runs and passes.
  auto open_srv = tcp::store_server::start("127.0.0.1", 0);
  REQUIRE(open_srv.ok());
  auto c = tcp::store_client::connect("127.0.0.1", open_srv.value()->port(), deadline::after(milliseconds(10000)));
  REQUIRE_MESSAGE(c.ok(), c.error().to_string());
  CHECK(c.value()->set("a", "b").ok());
  // A client with a token does not get into a store without one.
  auto t = tcp::store_client::connect("127.0.0.1", open_srv.value()->port(), deadline::after(milliseconds(10000)),
                                      milliseconds(10000), "some-token");
  REQUIRE_FALSE(t.ok());
  CHECK(t.error().message().find(refusal) != std::string::npos);
}

TEST_CASE("rendezvous: ranks without the job token are refused and the job goes on") {
  const std::uint16_t port = free_port();
  // Processes 0 and 1 are the job (CCLITE_RDZV_TOKEN=job-7-secret); 2 and 3
  // try to join as rank 1 with a wrong token and with none.
  auto r = test::run_ranks(
      4,
      [&](int proc, int) {
        launch_info li;
        li.size = 2;
        li.rank = proc == 0 ? 0 : 1;
        li.rdzv_host = "127.0.0.1";
        li.rdzv_port = port;
        li.job_id = "job7";
        if (proc >= 2) {
          auto s = tcp::open_store(li, deadline::after(milliseconds(60000)), nullptr);
          MP_REQUIRE(!s.ok());
          MP_CHECK(s.error().code() == errc::bootstrap_error);
          MP_CHECK(s.error().message().find(refusal) != std::string::npos);
          if (s.error().message().find(refusal) == std::string::npos)
            std::fprintf(stderr, "unexpected: %s\n", s.error().to_string().c_str());
          return 0;
        }
        std::unique_ptr<tcp::store_server> hosted;
        auto s = tcp::open_store(li, deadline::after(milliseconds(60000)), proc == 0 ? &hosted : nullptr);
        MP_REQUIRE_OK(s);
        if (proc == 0) {
          // Keep the server up until both intruders were turned away.
          for (int i = 0; i < 6000 && hosted->auth_failures() < 2; ++i)
            std::this_thread::sleep_for(milliseconds(10));
          MP_CHECK(hosted->auth_failures() == 2);
        }
        // The job's own ranks still meet through the store afterwards.
        auto all = store_allgather(*s.value(), "after", li.rank, 2, "r" + std::to_string(li.rank),
                                   deadline::after(milliseconds(60000)));
        MP_REQUIRE_OK(all);
        MP_CHECK(all.value()[0] == "r0");
        MP_CHECK(all.value()[1] == "r1");
        MP_REQUIRE_OK(s.value()->add("left", 1));
        if (proc == 0) {
          for (int i = 0; i < 6000; ++i) {
            auto n = s.value()->add("left", 0);
            MP_REQUIRE_OK(n);
            if (n.value() == 2) break;
            std::this_thread::sleep_for(milliseconds(10));
          }
        }
        return 0;
      },
      std::chrono::seconds(120),
      [](int proc) {
        if (proc <= 1) ::setenv("CCLITE_RDZV_TOKEN", "job-7-secret", 1);
        if (proc == 2) ::setenv("CCLITE_RDZV_TOKEN", "job-8-secret", 1);
        if (proc == 3) ::unsetenv("CCLITE_RDZV_TOKEN");
      });
  CHECK_MESSAGE(r.all_ok(), r.describe());
}
