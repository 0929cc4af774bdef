// train_fashion_mnist: data-parallel training of an MLP on Fashion-MNIST with cclite::train.
//
//   build/bin/cclite-run --nproc-per-node 2 build/bin/train_fashion_mnist --epochs 15
//   build/bin/cclite-run --nproc-per-node 2 build/bin/train_fashion_mnist --epochs 15 --resume
//
// Every rank holds the whole model (784-256-128-10 by default) and trains on
// its own shard of each shuffled epoch (train::distributed_sampler); the
// gradients are averaged by train::data_parallel, whose bucket allreduces run
// while backward still computes the lower layers. --batch is the *global*
// batch: each of N ranks takes batch/N samples per step, so the training
// follows the same trajectory whatever N is (up to float rounding).
// Rank 0 shows a progress bar per epoch, then the test accuracy (evaluated on
// all ranks, one shard each), and saves a checkpoint (parameters, optimiser
// state, epoch, sampler state) atomically after every epoch. --resume
// continues from it: a job killed mid-epoch loses only that epoch.
//
// Data: Debian's dataset-fashion-mnist package (/usr/share/datasets/fashion-mnist)
// or --data DIR with the four IDX files (gzipped or not).
#include <cclite/cclite.hpp>
#include <cclite/train/train.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "fashion_mnist.hpp"

namespace train = cclite::train;
using comm_t = cclite::default_communicator;

namespace {

struct args {
  int epochs = 15;
  int batch = 64;  // global
  std::string optimizer = "sgd";
  float lr = -1;  // per optimiser default
  float momentum = 0.9f;
  float weight_decay = -1;
  std::string schedule = "cosine";
  std::vector<int> hidden = {256, 128};
  std::string data = sample::default_fashion_mnist_dir();
  std::string checkpoint = "fashion_mnist.ckpt";
  bool save = true;
  bool resume = false;
  bool eval = true;
  std::uint64_t seed = 42;
  int threads = 0;  // 0: cores / ranks on this node
  long bucket_kb = 25 * 1024;
  // -1 (auto): when this node has a core to spare for the reduction, 256 KiB
  // (not DDP's 1 MiB, which would hold all 918 KiB of this model's gradients:
  // fc3 + fc2 are reduced while fc1's backward runs); otherwise one bucket,
  // reduced inline after backward: with one core per rank the communicator's
  // thread can only take its CPU time from backward, and the extra hand-offs
  // cost more than the overlap saves (docs/trainer.md, Performance).
  long first_bucket_kb = -1;
  // 0: fc1's weight gradient in one bucket. --split-kb 196 cuts it into 4 row
  // blocks with a bucket each, all but the last reduced while backward still
  // runs; with one core per rank that overlap only moves the reduction's CPU
  // work into backward (docs/trainer.md, Performance), so it is off by default.
  long split_kb = 0;
  // Gradients in the communicator's shared window (one node, shm): the
  // allreduce reads them where backward wrote them. 0: ordinary memory.
  bool shared_grads = true;
  // The optimiser step sharded over the node's ranks and fused with the
  // reduction (train::sharded_optimizer): the optimiser state exists once per
  // node instead of once per rank. Off by default: on this 2-core machine it
  // is slower (docs/trainer.md, Performance).
  bool shard = false;
  // Gradients sent as fp16 / bf16 (DDP's compress hooks): for links between nodes.
  train::grad_compression compress = train::grad_compression::none;
  int accumulate = 1;
  std::string progress = "auto";
  int timeline = 0;
  long max_steps = 0;  // per epoch, 0 = all (quick runs)
  bool profile = false;
};

void usage() {
  std::printf(
      "usage: train_fashion_mnist [options]\n"
      "  --epochs E            epochs to train (default 15)\n"
      "  --batch B             global batch, split evenly over the ranks (default 64)\n"
      "  --optimizer sgd|adamw (default sgd, with --momentum)\n"
      "  --lr X                learning rate (default adamw 1e-3, sgd 0.05)\n"
      "  --momentum X          SGD momentum (default 0.9)\n"
      "  --weight-decay X      (default adamw 1e-4, sgd 0)\n"
      "  --schedule cosine|constant  learning-rate schedule over all epochs (default cosine)\n"
      "  --hidden 256,128      hidden layer widths\n"
      "  --data DIR            dataset directory (default %s)\n"
      "  --checkpoint FILE     written by rank 0 after every epoch (default fashion_mnist.ckpt)\n"
      "  --no-checkpoint       do not save\n"
      "  --resume              continue from --checkpoint if it exists\n"
      "  --no-eval             skip the test-set evaluation\n"
      "  --seed S              shuffling and initialisation seed (default 42)\n"
      "  --threads N           BLAS threads per rank (default: cores / ranks on this node)\n"
      "  --bucket-kb K         gradient bucket cap (default 25600)\n"
      "  --first-bucket-kb K   first bucket cap (default: 256, the last two layers' gradients, when a\n"
      "                        core is left for the reduction; else all gradients in one bucket)\n"
      "  --split-kb K          cut a larger gradient into pieces of at most K KiB, each reduced as\n"
      "                        soon as backward computed it (default 0 = never; 196: fc1.weight in 4)\n"
      "  --shard-optimizer 0|1 optimiser step sharded over the node's ranks and fused with the\n"
      "                        gradient reduction, one copy of its state per node (default 0; needs\n"
      "                        --shared-grads 1 and one node, else it is the usual step)\n"
      "  --shared-grads 0|1    gradients in a window every local rank maps (default 1; used when all\n"
      "                        ranks share one node): reduced in place, without staging copies\n"
      "  --compress none|fp16|bf16  send gradients as 16-bit floats: half the bytes between nodes\n"
      "                        (default none; not worth it inside a node)\n"
      "  --accumulate K        micro-batches per step, communicating only the last (default 1)\n"
      "  --progress auto|bar|lines|none  (auto: bar on a terminal, lines otherwise)\n"
      "  --timeline N          print the bucket timeline of the first N steps of each epoch (not with\n"
      "                        --shard-optimizer 1: no buckets then)\n"
      "  --max-steps N         stop each epoch after N steps (quick runs)\n"
      "  --profile             print per epoch the median time of each phase of a step (rank 0)\n",
      sample::default_fashion_mnist_dir());
}

// Numbers are read whole and range-checked: "--lr abc" or "--batch 64x" is a
// usage error naming the option, never a silent 0.
template <class T>
bool number(const std::string& k, const char* v, T lo, T hi, T& out) {
  char* end = nullptr;
  errno = 0;
  bool ok = false;
  if constexpr (std::is_floating_point_v<T>) {
    const double x = std::strtod(v, &end);
    ok = end != v && !*end && errno == 0 && x >= static_cast<double>(lo) && x <= static_cast<double>(hi);
    if (ok) out = static_cast<T>(x);
  } else if constexpr (std::is_unsigned_v<T>) {
    const unsigned long long x = std::strtoull(v, &end, 10);
    ok = *v != '-' && end != v && !*end && errno == 0 && x >= lo && x <= hi;
    if (ok) out = static_cast<T>(x);
  } else {
    const long long x = std::strtoll(v, &end, 10);
    ok = end != v && !*end && errno == 0 && x >= lo && x <= hi;
    if (ok) out = static_cast<T>(x);
  }
  if (!ok) {
    auto show = [](T x) {
      if constexpr (!std::is_floating_point_v<T>) return std::to_string(x);
      char b[32];
      std::snprintf(b, sizeof b, "%g", static_cast<double>(x));
      return std::string(b);
    };
    std::fprintf(stderr, "%s takes a number from %s to %s, not '%s'\n", k.c_str(), show(lo).c_str(), show(hi).c_str(), v);
  }
  return ok;
}

bool one_of(const std::string& k, const std::string& v, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (v == n) return true;
  std::string list;
  for (const char* n : names) list += (list.empty() ? "" : ", ") + std::string(n);
  std::fprintf(stderr, "%s takes %s, not '%s'\n", k.c_str(), list.c_str(), v.c_str());
  return false;
}

bool parse(int argc, char** argv, args& a) {
  constexpr long kib_max = 1L << 30;  // 1 TiB, in KiB
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    bool ok = true;
    int flag = 0;
    if (k == "--epochs") ok = number(k, val(), 0, 1000000, a.epochs);
    else if (k == "--batch") ok = number(k, val(), 1, 1 << 24, a.batch);
    else if (k == "--optimizer") ok = one_of(k, a.optimizer = val(), {"sgd", "adamw"});
    else if (k == "--lr") ok = number(k, val(), 0.0f, 1e6f, a.lr);
    else if (k == "--momentum") ok = number(k, val(), 0.0f, 1.0f, a.momentum);
    else if (k == "--weight-decay") ok = number(k, val(), 0.0f, 1e6f, a.weight_decay);
    else if (k == "--schedule") ok = one_of(k, a.schedule = val(), {"cosine", "constant"});
    else if (k == "--data") a.data = val();
    else if (k == "--checkpoint") a.checkpoint = val();
    else if (k == "--no-checkpoint") a.save = false;
    else if (k == "--resume") a.resume = true;
    else if (k == "--no-eval") a.eval = false;
    else if (k == "--seed") ok = number(k, val(), std::uint64_t{0}, UINT64_MAX, a.seed);
    else if (k == "--threads") ok = number(k, val(), 0, 4096, a.threads);
    else if (k == "--bucket-kb") ok = number(k, val(), 1L, kib_max, a.bucket_kb);
    else if (k == "--first-bucket-kb") {
      const char* v = val();
      if (std::strcmp(v, "auto") == 0) a.first_bucket_kb = -1;
      else ok = number(k, v, 1L, kib_max, a.first_bucket_kb);
    } else if (k == "--split-kb") ok = number(k, val(), 0L, kib_max, a.split_kb);
    else if (k == "--shared-grads") ok = number(k, val(), 0, 1, flag), a.shared_grads = flag != 0;
    else if (k == "--shard-optimizer") ok = number(k, val(), 0, 1, flag), a.shard = flag != 0;
    else if (k == "--accumulate") ok = number(k, val(), 1, 1 << 20, a.accumulate);
    else if (k == "--compress") {
      const char* v = val();
      if (!train::parse_grad_compression(v, a.compress)) {
        std::fprintf(stderr, "--compress takes none, fp16 or bf16, not '%s'\n", v);
        return false;
      }
    }
    else if (k == "--progress") ok = one_of(k, a.progress = val(), {"auto", "bar", "lines", "none"});
    else if (k == "--timeline") ok = number(k, val(), 0, 1 << 30, a.timeline);
    else if (k == "--max-steps") ok = number(k, val(), 0L, 1L << 40, a.max_steps);
    else if (k == "--profile") a.profile = true;
    else if (k == "--hidden") {
      a.hidden.clear();
      const char* v = val();
      for (const char* p = v; *p;) {
        char* end;
        long w = std::strtol(p, &end, 10);
        if (end == p || w <= 0 || w > (1 << 20) || (*end && *end != ',')) {
          std::fprintf(stderr, "--hidden takes widths from 1 to %d separated by commas, not '%s'\n", 1 << 20, v);
          return false;
        }
        a.hidden.push_back(static_cast<int>(w));
        p = *end == ',' ? end + 1 : end;
      }
    } else if (k == "-h" || k == "--help") {
      usage();
      std::exit(0);
    } else {
      std::fprintf(stderr, "unknown option %s (see --help)\n", k.c_str());
      return false;
    }
    if (!ok) return false;
  }
  if (a.lr < 0) a.lr = a.optimizer == "sgd" ? 0.05f : 1e-3f;
  if (a.weight_decay < 0) a.weight_decay = a.optimizer == "sgd" ? 0.0f : 1e-4f;
  return true;
}

// SGD or AdamW behind one face (the sample lets the user pick), stepped
// through a sharded_optimizer when one was made (declared last: it goes first).
struct optimizer {
  std::unique_ptr<train::sgd> sgd;
  std::unique_ptr<train::adamw> adamw;
  std::unique_ptr<train::sharded_optimizer<comm_t, train::sgd>> sharded_sgd;
  std::unique_ptr<train::sharded_optimizer<comm_t, train::adamw>> sharded_adamw;
  void shard(train::data_parallel<comm_t>& ddp) {
    if (sgd) sharded_sgd = std::make_unique<train::sharded_optimizer<comm_t, train::sgd>>(ddp, *sgd);
    else sharded_adamw = std::make_unique<train::sharded_optimizer<comm_t, train::adamw>>(ddp, *adamw);
  }
  bool fused() const { return sharded_sgd ? sharded_sgd->fused() : sharded_adamw && sharded_adamw->fused(); }
  // After ddp.synchronize(), or (fused) the sharded step that also reduces.
  cclite::status step() {
    if (fused()) return sharded_sgd ? sharded_sgd->step() : sharded_adamw->step();
    sgd ? sgd->step() : adamw->step();
    return {};
  }
  void set_lr(float lr) { sgd ? sgd->set_lr(lr) : adamw->set_lr(lr); }
  void save(train::checkpoint& ck) const { sgd ? sgd->save_state(ck) : adamw->save_state(ck); }
  cclite::status load(const train::checkpoint& ck) { return sgd ? sgd->load_state(ck) : adamw->load_state(ck); }
};

// Rank 0's progress display: a bar redrawn in place on a terminal, or a
// line every 10% when the output goes to a pipe (cclite-run relays whole lines).
class progress_bar {
 public:
  progress_bar(const std::string& mode, bool enabled) {
    if (!enabled || mode == "none") mode_ = 0;
    else if (mode == "bar" || (mode == "auto" && ::isatty(STDOUT_FILENO))) mode_ = 2;
    else mode_ = 1;
  }
  /// Adds a step's loss sum over n samples; shows the mean since the last display.
  void update(int epoch, int epochs, long step, long steps, double samples_per_s, double loss_sum, double n) {
    if (mode_ == 0) return;
    loss_ += loss_sum;
    n_ += n;
    const int tenth = static_cast<int>(10 * step / steps);
    if (mode_ == 1 && tenth == last_tenth_ && step != steps) return;
    if (mode_ == 2 && step != steps && step % 20 != 0) return;
    last_tenth_ = tenth;
    const double loss = loss_ / (n_ > 0 ? n_ : 1.0);
    loss_ = n_ = 0;
    char bar[31];
    const int fill = static_cast<int>(30 * step / steps);
    for (int i = 0; i < 30; ++i) bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    std::printf("%sepoch %d/%d [%s] %3d%% %ld/%ld steps  %.0f samples/s  loss %.4f%s", mode_ == 2 ? "\r" : "", epoch,
                epochs, bar, static_cast<int>(100 * step / steps), step, steps, samples_per_s, loss,
                mode_ == 2 && step != steps ? "" : "\n");
    std::fflush(stdout);
  }
  void start_epoch() { last_tenth_ = 0, loss_ = n_ = 0; }

 private:
  int mode_ = 1;
  int last_tenth_ = 0;
  double loss_ = 0, n_ = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int fail(int rank, const cclite::status& st) {
  std::fprintf(stderr, "rank %d: %s\n", rank, st.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  args a;
  if (!parse(argc, argv, a)) {
    std::fprintf(stderr, "(train_fashion_mnist --help lists the options)\n");
    return 2;
  }
  // Started without a launcher (plain ./train_fashion_mnist): one process.
  const char* launcher_vars[] = {"CCLITE_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
  if (std::none_of(std::begin(launcher_vars), std::end(launcher_vars), [](const char* v) { return std::getenv(v) != nullptr; })) {
    ::setenv("CCLITE_RANK", "0", 1);
    ::setenv("CCLITE_WORLD_SIZE", "1", 1);
  }
  auto env = cclite::init();
  if (!env) return fail(-1, env.error());
  comm_t& comm = *env.value();
  const int rank = comm.rank(), world = comm.size();

  if (a.batch % (world * a.accumulate) != 0) {
    if (rank == 0) std::fprintf(stderr, "--batch %d must be a multiple of ranks (%d) x --accumulate (%d)\n", a.batch, world, a.accumulate);
    return 2;
  }
  const int local_batch = a.batch / world;          // per rank per step
  const int micro = local_batch / a.accumulate;     // per forward/backward
  int threads = a.threads;
  if (threads <= 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, comm.local_size()));
  train::set_compute_threads(threads);

  auto loaded = sample::load_fashion_mnist(a.data);
  if (!loaded) return fail(rank, loaded.error());
  const sample::fashion_mnist& ds = loaded.value();
  const int features = ds.train.features();

  // Pixels are normalised on the fly with a 256-entry table (the dataset's mean and std).
  float norm[256];
  for (int v = 0; v < 256; ++v) norm[v] = (v / 255.0f - 0.2860f) / 0.3530f;

  std::vector<int> sizes = {features};
  sizes.insert(sizes.end(), a.hidden.begin(), a.hidden.end());
  sizes.push_back(10);
  train::mlp net(sizes, micro, a.seed);

  train::dp_options dpo;
  dpo.bucket_cap_bytes = static_cast<std::size_t>(a.bucket_kb) << 10;
  long first_kb = a.first_bucket_kb;
  if (first_kb < 0) {
    const long cores = static_cast<long>(std::thread::hardware_concurrency());
    first_kb = cores > static_cast<long>(comm.local_size()) * threads ? 256 : a.bucket_kb;
  }
  dpo.first_bucket_cap_bytes = static_cast<std::size_t>(first_kb) << 10;
  dpo.shared_gradients = a.shared_grads;
  dpo.compression = a.compress;
  if (world > 1 && a.split_kb > 0) {
    // As many row blocks of fc1's weight gradient as data_parallel cuts it
    // into pieces (one process alone has nothing to overlap: no blocks).
    dpo.split_bytes = static_cast<std::size_t>(a.split_kb) << 10;
    const std::size_t w_bytes = static_cast<std::size_t>(sizes[0]) * static_cast<std::size_t>(sizes[1]) * sizeof(float);
    net.set_grad_blocks(static_cast<int>((w_bytes + dpo.split_bytes - 1) / dpo.split_bytes));
  }
  auto made = train::data_parallel<comm_t>::create(comm, net.parameters(), dpo);
  if (!made) return fail(rank, made.error());
  train::data_parallel<comm_t>& ddp = made.value();

  optimizer opt;
  if (a.optimizer == "sgd") opt.sgd = std::make_unique<train::sgd>(net.parameters(), train::sgd::options{a.lr, a.momentum, a.weight_decay, false});
  else opt.adamw = std::make_unique<train::adamw>(net.parameters(), train::adamw::options{a.lr, 0.9f, 0.999f, 1e-8f, a.weight_decay});
  if (a.shard) opt.shard(ddp);

  train::distributed_sampler sampler(static_cast<std::size_t>(ds.train.count), rank, world, a.seed);
  int first_epoch = 0;

  if (rank == 0) {
    std::printf("train_fashion_mnist: %d rank%s, MLP", world, world == 1 ? "" : "s");
    for (std::size_t i = 0; i < sizes.size(); ++i) std::printf("%s%d", i ? "-" : " ", sizes[i]);
    std::printf(" (%zu parameters), global batch %d (%d per rank%s), %s lr %g (%s), %d BLAS thread(s) per rank via %s%s%s%s\n",
                net.parameter_count(), a.batch, local_batch,
                a.accumulate > 1 ? (", " + std::to_string(a.accumulate) + " micro-batches").c_str() : "",
                a.optimizer.c_str(), static_cast<double>(a.lr), a.schedule.c_str(), threads, train::gemm_backend(),
                *train::gemm_kernels() ? " (" : "", train::gemm_kernels(), *train::gemm_kernels() ? " kernels)" : "");
    if (opt.fused())
      std::printf("gradients: %zu values in a shared window; the optimiser step is sharded over %d ranks and fused "
                  "with their reduction (--shard-optimizer 0: buckets as below)\n", ddp.flat_size(), world);
    std::printf("gradient buckets: %s%s%s\n", ddp.buckets().describe(sizeof(float)).c_str(),
                a.compress == train::grad_compression::none ? "" : ", sent as ",
                a.compress == train::grad_compression::none ? "" : train::to_string(a.compress));
    std::fflush(stdout);
  }

  // ---- resume: every rank reads the file; all must agree on it, or all stop ----
  if (a.resume) {
    const bool exists = ::access(a.checkpoint.c_str(), F_OK) == 0;
    double flag[2] = {exists ? 1.0 : 0.0, exists ? 1.0 : 0.0};  // min/max of "exists"
    cclite::status st = comm.allreduce(&flag[0], 1, cclite::reduce_op::min);
    if (st.ok()) st = comm.allreduce(&flag[1], 1, cclite::reduce_op::max);
    if (!st.ok()) return fail(rank, st);
    if (flag[1] == 0.0) {
      if (rank == 0) std::printf("--resume: no checkpoint at %s yet, starting at epoch 1\n", a.checkpoint.c_str());
    } else if (flag[0] == 0.0) {
      return fail(rank, cclite::make_error(cclite::errc::invalid_argument, "--resume: %s is missing on some rank (it must be on a filesystem every rank sees)", a.checkpoint.c_str()));
    } else {
      auto ck = train::checkpoint::load(a.checkpoint);
      cclite::status ls = ck ? cclite::status() : ck.error();
      std::uint64_t epoch = 0;
      if (ls.ok()) ls = train::load_parameters(ck.value(), net.parameters());
      if (ls.ok()) ls = opt.load(ck.value());
      if (ls.ok()) ls = sampler.load_state(ck.value());
      if (ls.ok()) {
        auto e = ck.value().get_u64("epochs_done");
        if (e) epoch = e.value(); else ls = e.error();
      }
      // Agree: everyone loaded, and the same bytes (payload checksum).
      std::uint64_t v[4] = {ls.ok() ? 0u : 1u, ls.ok() ? ck.value().checksum() : 0u, 0, 0};
      v[2] = v[1];
      st = comm.allreduce(&v[0], 1, cclite::reduce_op::max);
      if (st.ok()) st = comm.allreduce(&v[1], 1, cclite::reduce_op::min);
      if (st.ok()) st = comm.allreduce(&v[2], 1, cclite::reduce_op::max);
      if (!st.ok()) return fail(rank, st);
      if (!ls.ok()) return fail(rank, ls);
      if (v[0] != 0) return fail(rank, cclite::make_error(cclite::errc::invalid_argument, "another rank could not load %s", a.checkpoint.c_str()));
      if (v[1] != v[2]) return fail(rank, cclite::make_error(cclite::errc::mismatch, "ranks read different contents from %s", a.checkpoint.c_str()));
      first_epoch = static_cast<int>(epoch);
      if (rank == 0) std::printf("resumed from %s: %d epoch(s) done, continuing with epoch %d\n", a.checkpoint.c_str(), first_epoch, first_epoch + 1);
    }
  }

  std::vector<float> x(static_cast<std::size_t>(micro) * static_cast<std::size_t>(features));
  std::vector<std::uint8_t> y(static_cast<std::size_t>(micro));
  auto gather = [&](const sample::image_set& s, const std::size_t* idx, int n) {
    for (int j = 0; j < n; ++j) {
      const std::uint8_t* px = s.pixels.data() + idx[j] * static_cast<std::size_t>(features);
      float* row = x.data() + static_cast<std::size_t>(j) * static_cast<std::size_t>(features);
      for (int f = 0; f < features; ++f) row[f] = norm[px[f]];
      y[static_cast<std::size_t>(j)] = s.labels[idx[j]];
    }
  };

  progress_bar bar(a.progress, rank == 0);
  const long steps_per_epoch_full = static_cast<long>((sampler.num_samples() + static_cast<std::size_t>(local_batch) - 1) / static_cast<std::size_t>(local_batch));
  const long steps_per_epoch = a.max_steps > 0 ? std::min(a.max_steps, steps_per_epoch_full) : steps_per_epoch_full;
  const long total_steps = steps_per_epoch * a.epochs;
  double last_accuracy = -1;
  const auto job_start = std::chrono::steady_clock::now();

  for (int epoch = first_epoch; epoch < a.epochs; ++epoch) {
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    const std::vector<std::size_t>& mine = sampler.indices();
    bar.start_epoch();
    double loss_sum = 0, seen = 0, step_loss = 0, step_n = 0, sync_s = 0;
    // --profile: microseconds per step in each phase (gather, forward+backward,
    // synchronize, optimiser, whole step), medians printed per epoch.
    enum { ph_gather, ph_compute, ph_sync, ph_opt, ph_step, phases };
    std::vector<double> prof[phases];
    if (a.profile)
      for (auto& v : prof) v.reserve(static_cast<std::size_t>(steps_per_epoch));
    const auto t0 = std::chrono::steady_clock::now();
    for (long step = 0; step < steps_per_epoch; ++step) {
      const auto step_start = std::chrono::steady_clock::now();
      double gather_s = 0;
      if (a.schedule == "cosine") {
        const double progress = static_cast<double>(epoch * steps_per_epoch + step) / static_cast<double>(total_steps);
        opt.set_lr(static_cast<float>(a.lr * 0.5 * (1.0 + std::cos(M_PI * progress))));
      }
      const std::size_t begin = static_cast<std::size_t>(step) * static_cast<std::size_t>(local_batch);
      const int this_batch = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(local_batch), mine.size() - begin));
      const int parts = std::min(a.accumulate, this_batch);
      for (int m = 0; m < parts; ++m) {
        const int lo = this_batch * m / parts, hi = this_batch * (m + 1) / parts;
        const int n = hi - lo;
        const auto gather_start = std::chrono::steady_clock::now();
        gather(ds.train, mine.data() + begin + static_cast<std::size_t>(lo), n);
        gather_s += seconds_since(gather_start);
        const float* logits = net.forward(x.data(), n);
        auto r = train::softmax_cross_entropy(logits, y.data(), n, 10, net.output_grad(), 1.0f / static_cast<float>(this_batch));
        loss_sum += r.loss_sum;
        step_loss += r.loss_sum;
        seen += n;
        step_n += n;
        ddp.set_sync(m + 1 == parts);  // earlier micro-batches only accumulate
        // The first micro-batch overwrites the gradients (no zero_grad pass),
        // the others add to them.
        net.backward(n, [&](train::parameter& p, auto... range) { ddp.grad_ready(p, range...); }, m > 0);
      }
      // Fused: the reduction happens inside the optimiser's step, timed as
      // "optimizer" (synchronize stays 0).
      const auto sync_start = std::chrono::steady_clock::now();
      if (!opt.fused())
        if (auto st = ddp.synchronize(); !st.ok()) return fail(rank, st);
      const auto opt_start = std::chrono::steady_clock::now();
      sync_s += std::chrono::duration<double>(opt_start - sync_start).count();
      if (auto st = opt.step(); !st.ok()) return fail(rank, st);
      if (a.profile) {
        const auto end = std::chrono::steady_clock::now();
        auto us = [](std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
        prof[ph_gather].push_back(gather_s * 1e6);
        prof[ph_compute].push_back(us(sync_start - step_start) - gather_s * 1e6);
        prof[ph_sync].push_back(us(opt_start - sync_start));
        prof[ph_opt].push_back(us(end - opt_start));
        prof[ph_step].push_back(us(end - step_start));
      }
      sampler.set_position(begin + static_cast<std::size_t>(this_batch));
      if (rank == 0 && step < a.timeline && !opt.fused()) {  // fused: no buckets to show
        std::printf("timeline epoch %d step %ld: backward done at %.0f us;", epoch + 1, step, ddp.backward_end_us());
        const auto& tl = ddp.timeline();
        for (std::size_t b = 0; b < tl.size(); ++b)
          std::printf(" bucket %zu (%.0f KiB) issued %.0f us, %s, finished by %.0f us;", b,
                      static_cast<double>(ddp.buckets().buckets[b].count * sizeof(float)) / 1024.0, tl[b].launched_us,
                      tl[b].done_before_backward_end ? "done before backward ended" : "still running when backward ended",
                      tl[b].finished_us);
        std::printf("\n");
      }
      if (rank == 0) {
        const double el = seconds_since(t0);
        bar.update(epoch + 1, a.epochs, step + 1, steps_per_epoch, static_cast<double>((step + 1) * a.batch) / std::max(el, 1e-9),
                   step_loss, step_n);
        step_loss = step_n = 0;
      }
    }
    const double epoch_s = seconds_since(t0);

    // ---- evaluation: each rank one shard of the test set; sums allreduced ----
    double sums[5] = {loss_sum, seen, 0, 0, 0};  // train loss, train n, test loss, correct, test n
    if (a.eval) {
      std::vector<std::size_t> idx;
      for (std::size_t i = static_cast<std::size_t>(rank); i < static_cast<std::size_t>(ds.test.count); i += static_cast<std::size_t>(world)) idx.push_back(i);
      for (std::size_t b = 0; b < idx.size(); b += static_cast<std::size_t>(micro)) {
        const int n = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(micro), idx.size() - b));
        gather(ds.test, idx.data() + b, n);
        auto r = train::softmax_cross_entropy(net.forward(x.data(), n), y.data(), n, 10, nullptr, 0.0f);
        sums[2] += r.loss_sum;
        sums[3] += r.correct;
        sums[4] += n;
      }
    }
    if (auto st = comm.allreduce(sums, 5, cclite::reduce_op::sum); !st.ok()) return fail(rank, st);

    // ---- checkpoint: rank 0 writes it (atomically); the next epoch starts afresh ----
    std::string saved;
    if (a.save && rank == 0) {
      train::checkpoint ck;
      ck.put_u64("epochs_done", static_cast<std::uint64_t>(epoch + 1));
      train::save_parameters(ck, net.parameters());
      opt.save(ck);
      train::distributed_sampler next = sampler;
      next.set_epoch(static_cast<std::uint64_t>(epoch + 1));
      next.save_state(ck);
      if (auto st = ck.save(a.checkpoint); !st.ok()) return fail(rank, st);
      saved = ", checkpoint " + a.checkpoint;
    }
    if (rank == 0) {
      std::printf("epoch %d/%d: %.2f s, %.0f samples/s, train loss %.4f", epoch + 1, a.epochs, epoch_s,
                  sums[1] / epoch_s, sums[0] / std::max(sums[1], 1.0));
      if (world > 1) std::printf(" (%.2f s in synchronize)", sync_s);
      if (a.eval) {
        last_accuracy = sums[3] / sums[4];
        std::printf(", test loss %.4f, test accuracy %.4f", sums[2] / sums[4], last_accuracy);
      }
      std::printf("%s\n", saved.c_str());
      if (a.profile && !prof[ph_step].empty()) {
        auto median = [](std::vector<double>& v) {
          std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
          return v[v.size() / 2];
        };
        const double m[phases] = {median(prof[ph_gather]), median(prof[ph_compute]), median(prof[ph_sync]),
                                  median(prof[ph_opt]), median(prof[ph_step])};
        // The fastest tenth of the steps: what the step costs when no other
        // program took the CPU from a rank (a busy machine stretches the rest).
        auto& st = prof[ph_step];
        std::nth_element(st.begin(), st.begin() + static_cast<std::ptrdiff_t>(st.size() / 10), st.end());
        const double p10 = st[st.size() / 10];
        std::printf("profile epoch %d: median us per step: gather %.1f, forward+backward %.1f, synchronize %.1f, "
                    "optimizer %.1f, step %.1f (x %ld steps = %.3f s); step p10 %.1f us (%.3f s)\n",
                    epoch + 1, m[ph_gather], m[ph_compute], m[ph_sync], m[ph_opt], m[ph_step],
                    steps_per_epoch, m[ph_step] * 1e-6 * static_cast<double>(steps_per_epoch), p10,
                    p10 * 1e-6 * static_cast<double>(steps_per_epoch));
      }
      std::fflush(stdout);
    }
  }
  if (rank == 0) {
    if (last_accuracy >= 0) std::printf("final test accuracy %.4f after %d epochs (%.1f s)\n", last_accuracy, a.epochs, seconds_since(job_start));
    else std::printf("done: %d epochs (%.1f s)\n", a.epochs, seconds_since(job_start));
  }
  return 0;
}
