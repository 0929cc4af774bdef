// The sample trainer as users run it: build/bin/cclite-run --nproc-per-node 2
// build/bin/train_fashion_mnist on Debian's dataset-fashion-mnist. Short runs
// (--max-steps) check: a missing dataset names the package; training and
// --resume continue where the checkpoint left off; a job killed mid-epoch
// resumes from its last complete epoch; a truncated or corrupt checkpoint is
// refused with a message, and nothing is trained from it.
#include <cclite/train/checkpoint.hpp>

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support/mp.hpp"

namespace train = cclite::train;

namespace {

std::string bin_dir() {
  const char* d = std::getenv("CCLITE_BIN_DIR");
  return d ? d : "build/bin";
}
std::string trainer() { return bin_dir() + "/train_fashion_mnist"; }
bool have_trainer() { return ::access(trainer().c_str(), X_OK) == 0; }
bool have_dataset() { return ::access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) == 0; }

struct run_out {
  int rc = -1;
  std::string text;
};

run_out sh(const std::string& cmd) {
  run_out out;
  FILE* p = ::popen(("CCLITE_TIMEOUT=60 " + cmd + " 2>&1").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out.text += buf;
  int st = ::pclose(p);
  out.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// 2 ranks, short epochs (40 steps of 64), small model: a couple of seconds a run.
std::string job(const std::string& args) {
  return bin_dir() + "/cclite-run --timeout 120 --nproc-per-node 2 " + trainer() +
         " --hidden 64 --max-steps 40 --progress lines " + args;
}

}  // namespace

TEST_CASE("train_fashion_mnist: a missing dataset names the package to install") {
  if (!have_trainer()) {
    MESSAGE("train_fashion_mnist not built (no zlib): skipped");
    return;
  }
  cclite::test::temp_dir dir;
  run_out r = sh(trainer() + " --data " + dir.path + "/nothing-here --epochs 1");
  INFO(r.text);
  CHECK(r.rc != 0);
  CHECK(has(r.text, "dataset-fashion-mnist"));
  CHECK(has(r.text, "--data"));
}

TEST_CASE("train_fashion_mnist: a malformed or out-of-range option is refused by name, before any work") {
  if (!have_trainer()) {
    MESSAGE("train_fashion_mnist not built (no zlib): skipped");
    return;
  }
  // Each was once read as 0 or as another value without a word (atoi, strtof).
  const std::pair<const char*, const char*> bad[] = {
      {"--lr abc", "--lr takes a number from 0 to 1e+06, not 'abc'"},
      {"--batch 64x", "--batch takes a number from 1 to"},
      {"--batch 0", "--batch takes a number from 1 to"},
      {"--accumulate 0", "--accumulate takes a number from 1 to"},
      {"--seed -1", "--seed takes a number from 0 to 18446744073709551615, not '-1'"},
      {"--momentum 1.5", "--momentum takes a number from 0 to 1, not '1.5'"},
      {"--shared-grads yes", "--shared-grads takes a number from 0 to 1"},
      {"--schedule cosin", "--schedule takes cosine, constant, not 'cosin'"},
      {"--optimizer adam", "--optimizer takes sgd, adamw, not 'adam'"},
      {"--progress nope", "--progress takes auto, bar, lines, none"},
      {"--hidden 256,,x", "--hidden takes widths"},
      {"--epochs", "--epochs needs a value"},
  };
  for (const auto& [args, message] : bad) {
    // A missing --data directory: any work past parsing would fail differently.
    run_out r = sh(trainer() + " --data /nonexistent " + args);
    INFO(args, ": ", r.text);
    CHECK(r.rc == 2);
    CHECK(has(r.text, message));
    CHECK_FALSE(has(r.text, "dataset-fashion-mnist"));
  }
}

TEST_CASE("train_fashion_mnist: train, resume, kill mid-epoch and resume, refuse a damaged checkpoint") {
  if (!have_trainer() || !have_dataset()) {
    MESSAGE("train_fashion_mnist or dataset-fashion-mnist missing: skipped (scripts/install-deps.sh installs both)");
    return;
  }
  cclite::test::temp_dir dir;
  const std::string ck = dir.path + "/ck.bin";

  run_out a = sh(job("--epochs 2 --checkpoint " + ck));
  INFO(a.text);
  REQUIRE(a.rc == 0);
  CHECK(has(a.text, "[rank 0]: epoch 1/2 ["));  // the progress bar
  CHECK(has(a.text, "epoch 2/2:"));
  CHECK(has(a.text, "test accuracy"));
  REQUIRE(train::checkpoint::load(ck).ok());
  CHECK(train::checkpoint::load(ck).value().get_u64("epochs_done").value() == 2);

  run_out b = sh(job("--epochs 3 --resume --checkpoint " + ck));
  INFO(b.text);
  CHECK(b.rc == 0);
  CHECK(has(b.text, "2 epoch(s) done, continuing with epoch 3"));
  CHECK_FALSE(has(b.text, "epoch 1/3:"));
  CHECK(has(b.text, "epoch 3/3:"));

  // Killed mid-epoch: SIGTERM to the launcher (it forwards to the workers)
  // once the first checkpoint exists and the next epoch is under way.
  const std::string ck2 = dir.path + "/ck2.bin", log = dir.path + "/killed.log";
  pid_t pid = ::fork();
  if (pid == 0) {
    const std::string cmd = "CCLITE_TIMEOUT=60 exec " + job("--epochs 1000 --max-steps 200 --checkpoint " + ck2) + " > " + log + " 2>&1";
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (::access(ck2.c_str(), F_OK) != 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // into the next epoch
  ::kill(pid, SIGTERM);
  int st = 0;
  ::waitpid(pid, &st, 0);
  REQUIRE(::access(ck2.c_str(), F_OK) == 0);
  auto saved = train::checkpoint::load(ck2);  // atomic: complete even when killed while writing
  REQUIRE(saved.ok());
  const auto done = saved.value().get_u64("epochs_done").value();
  CHECK(done >= 1);
  const std::string next = std::to_string(done + 1);
  run_out c = sh(job("--epochs " + next + " --resume --checkpoint " + ck2));
  INFO(c.text);
  CHECK(c.rc == 0);
  CHECK(has(c.text, std::to_string(done) + " epoch(s) done, continuing with epoch " + next));
  CHECK(has(c.text, "epoch " + next + "/" + next + ":"));

  // Damaged checkpoints: refused with the reason, and no epoch runs.
  std::ifstream in(ck, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() > 100);
  {
    std::ofstream out(ck, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  run_out d = sh(job("--epochs 5 --resume --checkpoint " + ck));
  INFO(d.text);
  CHECK(d.rc != 0);
  CHECK(has(d.text, "truncated"));
  CHECK(has(d.text, ck));
  CHECK_FALSE(has(d.text, "epoch 4/5:"));
  bytes[bytes.size() - 7] ^= 0x01;
  {
    std::ofstream out(ck, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  run_out e = sh(job("--epochs 5 --resume --checkpoint " + ck));
  INFO(e.text);
  CHECK(e.rc != 0);
  CHECK(has(e.text, "corrupt"));
  CHECK_FALSE(has(e.text, "epoch 4/5:"));
}

// An elastic job (cclite-run --nnodes MIN:MAX) restarts its workers with another
// world size when a node is lost or joins; they resume from the checkpoint.
TEST_CASE("train_fashion_mnist: a 2-rank checkpoint resumes in a 3-rank job") {
  if (!have_trainer() || !have_dataset()) {
    MESSAGE("train_fashion_mnist or dataset-fashion-mnist missing: skipped (scripts/install-deps.sh installs both)");
    return;
  }
  cclite::test::temp_dir dir;
  const std::string ck = dir.path + "/ck.bin";
  auto ranks = [&](int n, const std::string& args) {  // a global batch of 96 splits over 2 and 3 ranks
    return bin_dir() + "/cclite-run --timeout 120 --nproc-per-node " + std::to_string(n) + " " + trainer() +
           " --hidden 64 --max-steps 40 --batch 96 --progress none --checkpoint " + ck + " " + args;
  };
  run_out a = sh(ranks(2, "--epochs 1"));
  INFO(a.text);
  REQUIRE(a.rc == 0);
  run_out b = sh(ranks(3, "--epochs 2 --resume"));
  INFO(b.text);
  CHECK(b.rc == 0);
  CHECK(has(b.text, "1 epoch(s) done, continuing with epoch 2"));
  CHECK(has(b.text, "epoch 2/2:"));
  REQUIRE(train::checkpoint::load(ck).ok());
  CHECK(train::checkpoint::load(ck).value().get_u64("epochs_done").value() == 2);
}

// --shard-optimizer 1 (train::sharded_optimizer) trains the same model as the
// plain step, bit for bit: the losses and accuracies printed per epoch agree,
// for SGD and AdamW, and the job says it runs sharded.
TEST_CASE("train_fashion_mnist: --shard-optimizer 1 prints the plain step's losses") {
  if (!have_trainer() || !have_dataset()) {
    MESSAGE("train_fashion_mnist or dataset-fashion-mnist missing: skipped");
    return;
  }
  // "train loss 0.6698 ... test loss 0.4786, test accuracy 0.8206" of every epoch line.
  auto figures = [](const std::string& text) {
    std::string out;
    std::size_t at = 0;
    while ((at = text.find("train loss ", at)) != std::string::npos) {
      const std::size_t end = text.find('\n', at);
      std::string line = text.substr(at, end - at);
      const std::size_t sync = line.find(" (");
      const std::size_t test = line.find("test loss");
      out += line.substr(0, sync) + " | " + (test == std::string::npos ? "" : line.substr(test, 40)) + "\n";
      at = end;
    }
    return out;
  };
  for (const char* opt : {"sgd", "adamw"}) {
    const std::string common = std::string("--epochs 2 --no-checkpoint --optimizer ") + opt;
    run_out plain = sh(job(common + " --shard-optimizer 0"));
    run_out sharded = sh(job(common + " --shard-optimizer 1"));
    INFO(plain.text, sharded.text);
    REQUIRE(plain.rc == 0);
    REQUIRE(sharded.rc == 0);
    CHECK(has(sharded.text, "the optimiser step is sharded over 2 ranks"));
    CHECK_FALSE(has(plain.text, "sharded"));
    const std::string a = figures(plain.text), b = figures(sharded.text);
    CHECK(std::count(a.begin(), a.end(), '\n') == 2);
    CHECK(a == b);
  }
}
