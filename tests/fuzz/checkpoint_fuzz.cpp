// libFuzzer target: loading a training checkpoint (include/cclite/train/checkpoint.hpp)
// and restoring a model, its optimiser and its sampler from it, as
// `train_fashion_mnist --resume` does.
//
// The first byte picks what the rest is:
//   even: a whole file, as read from disk (checksums and all), so mutations
//         exercise the refusals of truncated, corrupt and foreign files;
//   odd:  a payload of sections; the harness wraps it in a header with the
//         right length and checksums (section count: the second byte), so the
//         fuzzer reaches the section parser and the restoring code with
//         well-formed files that hold wrong names, sizes and values, as a
//         checkpoint of another model or program would.
// What must hold (a violation aborts; ASan/UBSan findings crash):
//   - a refused file gives errc::protocol_error, with a message naming it;
//   - an accepted file serializes back to exactly its bytes;
//   - restoring from it either succeeds or returns an error, and a refused
//     load_parameters() leaves every parameter value untouched.
#include <cclite/train/checkpoint.hpp>
#include <cclite/train/mlp.hpp>
#include <cclite/train/optim.hpp>
#include <cclite/train/sampler.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace cclite;

#define FUZZ_ASSERT(c) \
  do {                 \
    if (!(c)) std::abort(); \
  } while (0)

namespace {

void put_le(std::vector<std::uint8_t>& v, std::uint64_t x, int bytes) {
  for (int i = 0; i < bytes; ++i) v.push_back(static_cast<std::uint8_t>(x >> (8 * i)));
}

// The header checkpoint::serialize() would write for this payload.
std::vector<std::uint8_t> wrap(const std::uint8_t* payload, std::size_t n, std::uint32_t sections) {
  std::vector<std::uint8_t> f(train::checkpoint::magic, train::checkpoint::magic + 8);
  put_le(f, train::checkpoint::version, 4);
  put_le(f, sections, 4);
  put_le(f, n, 8);
  put_le(f, train::detail::crc32c(payload, n), 4);
  put_le(f, train::detail::crc32c(f.data(), f.size()), 4);
  f.insert(f.end(), payload, payload + n);
  return f;
}

std::vector<float> values_of(const train::parameter_list& ps) {
  std::vector<float> v;
  for (const train::parameter* p : ps) v.insert(v.end(), p->value(), p->value() + p->size());
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  std::vector<std::uint8_t> file =
      (data[0] & 1) ? wrap(data + 2, size - 2, data[1]) : std::vector<std::uint8_t>(data + 1, data + size);

  auto ck = train::checkpoint::parse(file.data(), file.size(), "fuzz.ckpt");
  if (!ck) {
    FUZZ_ASSERT(ck.error().code() == errc::protocol_error);
    FUZZ_ASSERT(ck.error().message().find("checkpoint 'fuzz.ckpt' refused: ") == 0);
    return 0;
  }
  train::checkpoint& c = ck.value();
  FUZZ_ASSERT(c.serialize() == file);

  // The model, optimisers and sampler of the seed corpus (make_corpus.py):
  // a 3-2-2 MLP, SGD and AdamW state, a sampler over 10 samples on 2 ranks.
  train::mlp net({3, 2, 2}, 4, 1);
  const train::parameter_list params = net.parameters();
  const std::vector<float> before = values_of(params);
  if (!train::load_parameters(c, params).ok()) FUZZ_ASSERT(values_of(params) == before);

  train::sgd sgd(params, {0.1f, 0.9f});
  (void)sgd.load_state(c);
  train::adamw adam(params, {});
  (void)adam.load_state(c);

  train::distributed_sampler sampler(10, 1, 2, 7);
  if (sampler.load_state(c).ok()) {
    FUZZ_ASSERT(sampler.position() <= sampler.num_samples());
    for (std::size_t i : sampler.indices()) FUZZ_ASSERT(i < 10);
  }
  return 0;
}
